// dlrun-rdzv-probe: the worker of bench/rdzv_bench.py, compiled so that its start-up costs
// the same ~1 ms under every launcher and the benchmark times the launchers, not Python.
//
// Usage: dlrun-rdzv-probe OUT_DIR [STOP_FILE]
// First thing, it reads the clock; then writes OUT_DIR/<rank>-<restart>-<pid>.json (through a
// temporary name and a rename, so a file that exists is complete) with that time, RANK,
// WORLD_SIZE, GROUP_RANK, TORCHELASTIC_RESTART_COUNT, MASTER_ADDR, MASTER_PORT, its PID, an id
// unique to this process and BENCH_AGENT. Without STOP_FILE it exits 0; with it, it waits until
// STOP_FILE exists (looking every 20 ms, for at most 10 minutes), then exits 0.
// With BENCH_SIGNAL_PID set it sends that process SIGUSR1 right after reading the clock, before
// the record exists: rdzv_bench.py's --control has dlrund --stats take a snapshot of its counts
// at each worker's start.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace {

// An integer variable as JSON: null when the launcher did not set it.
std::string number(const char* name) {
  const char* value = std::getenv(name);
  if (!value || !*value) return "null";
  for (const char* c = value; *c; ++c) {
    if (*c < '0' || *c > '9') return "null";
  }
  return value;
}

// A variable as a JSON string (null when unset); the launchers set addresses, port numbers
// and small names, so only a quote or a backslash needs escaping.
std::string text(const char* name) {
  const char* value = std::getenv(name);
  if (!value) return "null";
  std::string quoted = "\"";
  for (const char* c = value; *c; ++c) {
    if (*c == '"' || *c == '\\') quoted += '\\';
    quoted += *c;
  }
  return quoted + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  const auto start = std::chrono::system_clock::now();
  if (const char* notify = std::getenv("BENCH_SIGNAL_PID"); notify && *notify)
    ::kill(static_cast<pid_t>(std::atoi(notify)), SIGUSR1);
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: dlrun-rdzv-probe OUT_DIR [STOP_FILE]\n");
    return 2;
  }
  const double seconds = std::chrono::duration<double>(start.time_since_epoch()).count();
  const std::string pid = std::to_string(::getpid());
  char time[64];
  std::snprintf(time, sizeof(time), "%.6f", seconds);
  const std::string record = std::string("{\"time\": ") + time + ", \"rank\": " + number("RANK") +
                             ", \"world_size\": " + number("WORLD_SIZE") +
                             ", \"group_rank\": " + number("GROUP_RANK") +
                             ", \"restart_count\": " + number("TORCHELASTIC_RESTART_COUNT") +
                             ", \"master_addr\": " + text("MASTER_ADDR") +
                             ", \"master_port\": " + number("MASTER_PORT") +
                             ", \"pid\": " + pid + ", \"uid\": \"" + pid + "-" +
                             std::to_string(start.time_since_epoch().count()) +
                             "\", \"agent\": " + text("BENCH_AGENT") + "}";
  const std::string name = std::string(argv[1]) + "/" + number("RANK") + "-" +
                           number("TORCHELASTIC_RESTART_COUNT") + "-" + pid + ".json";
  {
    std::ofstream out(name + ".tmp");
    out << record;
    if (!out.flush()) return 1;
  }
  std::filesystem::rename(name + ".tmp", name);
  if (argc == 3) {
    for (int i = 0; i < 30'000 && !std::filesystem::exists(argv[2]); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 0;
}
