// dlrun-rdzv-load: K simulated agents, each an ElasticRendezvous on its own thread with its
// own connection, join one round at a store (a dlrund started by bench/rdzv_load.sh). Prints
// the time from the moment all K are connected to the moment the last one holds its rank, and
// checks that the ranks are a permutation. The roster (TF_CONFIG's O(N) endpoint list) is
// not read: this measures the rendezvous itself.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "common/cli.h"
#include "common/clock.h"
#include "common/error.h"
#include "rendezvous/elastic_rendezvous.h"

using namespace dlrun;
int main(int argc, char** argv) {
  return guardedMain([&] {
    CLI::App app("dlrun-rdzv-load: K simulated agents join one rendezvous round");
    int agents = 256;
    std::string host = "127.0.0.1", runId = "load";
    uint16_t port = 0;
    app.add_option("--agents", agents, "Simulated agents")->check(CLI::Range(1, 20000));
    app.add_option("--host", host, "Store address");
    app.add_option("--port", port, "Store port")->required();
    app.add_option("--run-id", runId, "Rendezvous id (fresh per run)");
    if (auto code = parseCommandLine(app, {argv + 1, argv + argc}, "dev")) return *code;

    std::vector<std::unique_ptr<rendezvous::ElasticRendezvous>> nodes(agents);
    std::vector<int> groupRanks(agents, -1);
    std::vector<Clock::time_point> done(agents);
    std::vector<std::string> errors(agents);
    Clock::time_point connected, joined;
    // Everyone connects first, so the time measured is the rendezvous, not the connects.
    std::barrier ready(agents, [&]() noexcept { connected = Clock::now(); });
    std::vector<std::thread> threads;
    for (int i = 0; i < agents; ++i) {
      threads.emplace_back([&, i] {
        try {
          nodes[i] = std::make_unique<rendezvous::ElasticRendezvous>(rendezvous::ElasticOptions{
              .runId = runId,
              .minNodes = agents,
              .maxNodes = agents,
              .store = HostPort{host, port},
              .self = {.addr = "127.0.0.1", .name = "sim" + std::to_string(i), .nproc = 1},
              .joinTimeout = std::chrono::seconds(120),
              .fetchRoster = false,
          });
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
        ready.arrive_and_wait();
        if (!nodes[i]) return;
        try {
          groupRanks[i] = std::get<rendezvous::World>(nodes[i]->next()).groupRank;
          done[i] = Clock::now();
        } catch (const std::exception& e) {
          errors[i] = e.what();
        }
      });
    }
    for (auto& t : threads) t.join();
    joined = Clock::now();
    for (const auto& e : errors) {
      if (!e.empty()) throw Error("a simulated agent failed: " + e);
    }
    std::vector<bool> seen(agents, false);
    for (int r : groupRanks) {
      if (r < 0 || r >= agents || seen[r]) throw Error("group ranks are not a permutation");
      seen[r] = true;
    }
    std::sort(done.begin(), done.end());
    auto since = [&](Clock::time_point t) {
      return std::chrono::duration<double>(t - connected).count();
    };
    // The first agent to hold its rank shows when the round closed; the rest is fan-out.
    std::printf("agents=%d rendezvous_s=%.4f first_s=%.4f median_s=%.4f\n", agents, since(joined),
                since(done.front()), since(done[agents / 2]));
    return 0;
  });
}
