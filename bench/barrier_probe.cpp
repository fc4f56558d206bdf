// dlrun-barrier-probe: a worker that does one store barrier as torch's init_process_group does
// (torch.distributed's _store_based_barrier: ADD to a counter, the last arrival SETs a key that
// every rank WAITs on) through MASTER_ADDR:MASTER_PORT, then exits 0. The worker of
// bench/proxy_bench.py and tests/python/test_dlrun_store_proxy.py: a launch of thousands
// measures the store (and the proxy) instead of torch's import.
//
// Usage: dlrun-barrier-probe [KEY_PREFIX]   (default "barrier"; RANK, WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT from the environment). Exits 1 with a line on stderr when the store fails it.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "store/tcp_store.h"

int main(int argc, char** argv) {
  const char* addr = std::getenv("MASTER_ADDR");
  const char* port = std::getenv("MASTER_PORT");
  const char* world = std::getenv("WORLD_SIZE");
  if (!addr || !port || !world) {
    std::fputs("dlrun-barrier-probe: MASTER_ADDR, MASTER_PORT and WORLD_SIZE must be set\n",
               stderr);
    return 2;
  }
  const std::string prefix = argc > 1 ? argv[1] : "barrier";
  try {
    dlrun::TcpStore store({.at = {addr, static_cast<uint16_t>(std::atoi(port))},
                           .timeout = std::chrono::minutes(10),
                           // The agent beside it may be starting thousands of workers.
                           .handshakeTimeout = std::chrono::minutes(10)});
    if (store.add(prefix + "/count", 1) == std::atoll(world)) store.set(prefix + "/done", "1");
    store.wait({prefix + "/done"}, std::chrono::minutes(10));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dlrun-barrier-probe: %s\n", e.what());
    return 1;
  }
  return 0;
}
