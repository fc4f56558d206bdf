// The network probe once a round of several nodes formed (network_probe.h), on the rendezvous
// thread, before the job's first workers start and a quarter of its bound after a later round's
// start: each node tells the round where its agent answers, measures its link to the next
// node's, and the round's first node names the slowest link. Bounded by
// --network-probe-timeout; whatever it cannot do is said and the round goes on.
#include <nlohmann/json.hpp>

#include <algorithm>

#include "agents/agent_impl.h"
#include "agents/network_probe.h"

namespace dlrun::agents::detail {

namespace {

struct ProbeTarget {
  std::string node, address;
};

// The member after `self` in the round's order (wrapping), of those that said where they answer.
std::optional<ProbeTarget> nextMember(const std::vector<std::string>& shared,
                                      const std::string& self) {
  const auto mine = std::find(shared.begin(), shared.end(), self);
  if (mine == shared.end()) return std::nullopt;
  const size_t n = shared.size(), at = static_cast<size_t>(mine - shared.begin());
  for (size_t step = 1; step < n; ++step) {
    const std::string& text = shared[(at + step) % n];
    if (text.empty()) continue;
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_object() && j.contains("node") && j.contains("at"))
      return ProbeTarget{j["node"].get<std::string>(), j["at"].get<std::string>()};
  }
  return std::nullopt;
}

}  // namespace

void AgentImpl::probeNetwork(const rendezvous::World& world, bool settle) {
  if (!options_.networkProbe || world.groupWorldSize < 2 ||
      world.workerEndpoints.size() <= static_cast<size_t>(world.baseRank))
    return;
  const auto deadline = Clock::now() + *options_.networkProbe;
  // A later round's workers re-form their group and take their state first (an in-process
  // recovery: some 0.1 s on a CPU job): 4 MiB sent each way meanwhile cost it 10-20 ms of the
  // cores and the network it needs. The wait counts within the bound (the round's end is heeded
  // after it all, and the node's lease must not lapse meanwhile).
  if (settle && !pauseRoundThread(*options_.networkProbe / 4)) return;
  const std::string host = parseHostPort(world.workerEndpoints[world.baseRank], 0).host;
  const std::string self = options_.nodeName.empty() ? host : options_.nodeName;
  try {
    // Made here, then served by the agent's loop alone: this thread keeps only its address.
    if (!probeServer_) probeServer_.emplace(io_, host);
    const std::string mine = nlohmann::json{{"node", self}, {"at", probeServer_->address()}}.dump();
    const auto storeStart = Clock::now();  // a request (and, the first time, its connection)
    rendezvous_.shareWithRound(rendezvous::RoundTopic::ProbeAddress, mine);
    const double storeMs =
        std::chrono::duration<double, std::milli>(Clock::now() - storeStart).count();
    const auto remaining = [&] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    };
    const auto target = nextMember(
        rendezvous_.gatherFromRound(rendezvous::RoundTopic::ProbeAddress, remaining()), mine);
    LinkMeasure measure{.from = self, .problem = "no other node said in time where it answers"};
    if (target) measure = probeLink(self, target->node, target->address, kProbeBytes, deadline);
    measure.storeMs = storeMs;
    rendezvous_.shareWithRound(rendezvous::RoundTopic::Probe, measure.encode());
    if (world.groupRank != 0) return;
    std::vector<LinkMeasure> links;
    int missing = 0;
    for (const auto& text : rendezvous_.gatherFromRound(rendezvous::RoundTopic::Probe, remaining()))
      if (text.empty())
        ++missing;
      else
        links.push_back(LinkMeasure::decode(text));
    std::vector<std::string> lines = describeLinks(links);
    if (missing > 0)
      lines.push_back("network probe: " + std::to_string(missing) + " of the round's " +
                      std::to_string(world.groupWorldSize) + " nodes sent no measure in time");
    asio::post(io_, [this, lines = std::move(lines)] {
      for (const auto& line : lines) {
        log::info(line);
        publishEvent("network_probe", -1, line);
      }
    });
  } catch (const std::exception& e) {  // whatever the probe meets, the round goes on
    asio::post(io_, [message = std::string(e.what())] {
      log::info("network probe: not measured: " + message);
    });
  }
}

}  // namespace dlrun::agents::detail
