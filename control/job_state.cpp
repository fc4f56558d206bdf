#include "control/job_state.h"

#include <algorithm>
#include <map>

#include "common/error.h"
#include "common/text.h"
#include "rendezvous/elastic_protocol.h"

namespace dlrun::control {

namespace {

using rendezvous::RoundEnd;
namespace elastic = rendezvous::elastic;

// A round number or a round's member count; nullopt for "abort", "stop" or a missing key.
std::optional<int> number(const std::string& text) { return parseInteger<int>(text); }

std::optional<RoundEnd> roundEnd(const std::string& text) {
  if (text.empty()) return std::nullopt;
  return elastic::decodeRoundEnd(text);
}

int failuresIn(const std::optional<RoundEnd>& end) {
  return end && end->countsAsFailure() ? end->failures : 0;
}

v1::JobState endState(const RoundEnd& end) {
  switch (end.kind) {
    case RoundEnd::Kind::Finished: return v1::SUCCEEDED;
    case RoundEnd::Kind::Stopped: return v1::STOPPED;
    default: return v1::FAILED;  // endsJob(): a final worker failure
  }
}

}  // namespace

JobStatus jobStatus(const RoundKeys& keys) {
  JobStatus status;
  if (!keys.current.empty()) {
    const auto round = number(keys.current);
    if (!round) throw ProtocolError("malformed round number '" + keys.current + "' in the store");
    status.round = *round;
  }
  const auto end = roundEnd(keys.end);
  const auto previousEnd = roundEnd(keys.previousEnd);
  const int before =
      keys.assignment.empty() ? 0 : elastic::decodeAssignment(keys.assignment).failures;
  status.restartsUsed = std::max({before, failuresIn(end), failuresIn(previousEnd)});

  if (end && end->endsJob()) {
    status.state = endState(*end);
    status.end = end;
  } else if (auto stop = roundEnd(keys.stop)) {
    status.state = v1::STOPPED;
    status.end = stop;
  } else if (end) {
    status.state = v1::RESTARTING;
  } else if (number(keys.closed)) {
    status.state = v1::RUNNING;
  } else {
    // Forming, or aborted ("abort"): after a round that ran, that is a restart.
    const bool ranBefore = number(keys.previousClosed) || !keys.forgotten.empty();
    status.state = ranBefore ? v1::RESTARTING : v1::FORMING;
  }
  return status;
}

JobStatus localJobStatus(const RoundKeys& keys, std::optional<int> nodeRound) {
  JobStatus status;
  if (nodeRound) {
    status.state = v1::RUNNING;
    status.round = *nodeRound;
    status.restartsUsed = *nodeRound;
  }
  if (auto stop = roundEnd(keys.stop)) {
    status.state = v1::STOPPED;
    status.end = stop;
  }
  return status;
}

std::vector<int64_t> replacedBy(const std::vector<AgentRecord>& agents) {
  std::vector<int64_t> out(agents.size(), 0);
  std::map<std::string, std::vector<size_t>> byHost;  // registration order within each host
  for (size_t i = 0; i < agents.size(); ++i) byHost[agents[i].name].push_back(i);
  for (const auto& [name, onHost] : byHost) {
    for (size_t a = 0; a < onHost.size(); ++a) {
      const auto& older = agents[onHost[a]].state;
      if (!older) continue;
      for (size_t b = a + 1; b < onHost.size() && out[onHost[a]] == 0; ++b) {
        const auto& later = agents[onHost[b]].state;
        if (later && later->firstRound > older->round) out[onHost[a]] = agents[onHost[b]].id;
      }
    }
  }
  return out;
}

}  // namespace dlrun::control
