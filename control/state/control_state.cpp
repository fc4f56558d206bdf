#include "control/state/control_state.h"

#include <signal.h>

#include <set>

#include "common/text.h"
#include "store/json_fields.h"

namespace dlrun::control {

using json_fields::field;
using json_fields::json;
using json_fields::parse;

std::string encodeCommand(const ControlCommand& command) {
  switch (command.kind) {
    case ControlCommand::Kind::Stop: return "stop:" + std::to_string(command.value);
    case ControlCommand::Kind::Logs: return "logs:" + std::to_string(command.value);
    case ControlCommand::Kind::Signal: break;
  }
  return std::to_string(command.value);
}

std::optional<ControlCommand> decodeCommand(std::string_view text) {
  ControlCommand command;
  std::string_view number = text;
  for (const auto& [prefix, kind] : {std::pair{"stop:", ControlCommand::Kind::Stop},
                                     std::pair{"logs:", ControlCommand::Kind::Logs}}) {
    if (number.starts_with(prefix)) {
      command.kind = kind;
      number.remove_prefix(5);
    }
  }
  const auto value = parseInteger<int>(number);
  if (!value) return std::nullopt;
  command.value = *value;
  if (command.kind == ControlCommand::Kind::Logs && command.value < 1) return std::nullopt;
  if (command.kind == ControlCommand::Kind::Signal &&
      (command.value < 1 || command.value > SIGRTMAX))
    return std::nullopt;
  if (command.kind == ControlCommand::Kind::Stop && (command.value < 0 || command.value > 255))
    return std::nullopt;
  return command;
}

std::string encode(const ControlMeta& m) {
  return json{{"backend", m.backend},
              {"min", m.minNodes},
              {"max", m.maxNodes},
              {"max_restarts", m.maxRestarts},
              {"token", m.tokenHash}}
      .dump();
}

ControlMeta decodeMeta(std::string_view text) {
  static constexpr const char* what = "job settings";
  const json j = parse(text, what);
  return {.backend = field<std::string>(j, "backend", what),
          .minNodes = field<int>(j, "min", what),
          .maxNodes = field<int>(j, "max", what),
          .maxRestarts = field<int>(j, "max_restarts", what),
          .tokenHash = field<std::string>(j, "token", what)};
}

std::string encode(const NodeState& n) {
  json workers = json::array();
  for (const auto& w : n.workers) {
    workers.push_back({{"rank", w.rank},
                       {"local", w.localRank},
                       {"pid", w.pid},
                       {"state", w.state},
                       {"exit", w.exit},
                       {"step", w.step},
                       {"progress", w.progressTime}});
  }
  json out{{"name", n.name},     {"addr", n.address},    {"group", n.groupRank},
           {"state", n.state},   {"round", n.round},     {"logs", n.logDir},
           {"workers", workers}, {"updated", n.updated}, {"first", n.firstRound}};
  if (n.sittingOut) out["out"] = {{"cause", n.sittingOut->cause}, {"why", n.sittingOut->reason}};
  return out.dump();
}

NodeState decodeNodeState(std::string_view text) {
  static constexpr const char* what = "node state";
  const json j = parse(text, what);
  NodeState n{.name = field<std::string>(j, "name", what),
              .address = field<std::string>(j, "addr", what),
              .groupRank = field<int>(j, "group", what),
              .state = field<std::string>(j, "state", what),
              .round = field<int>(j, "round", what),
              .logDir = field<std::string>(j, "logs", what),
              .updated = field<double>(j, "updated", what),
              .firstRound = field<int>(j, "first", what)};
  for (const auto& w : field<json>(j, "workers", what)) {
    if (!w.is_object()) throw ProtocolError("node state has a malformed 'workers'");
    n.workers.push_back({.rank = field<int>(w, "rank", what),
                         .localRank = field<int>(w, "local", what),
                         .pid = field<int>(w, "pid", what),
                         .state = field<std::string>(w, "state", what),
                         .exit = field<std::string>(w, "exit", what),
                         .step = field<int64_t>(w, "step", what),
                         .progressTime = field<double>(w, "progress", what)});
  }
  // Absent from the records of agents before it (and of nodes that sit none out).
  if (j.contains("out")) {
    const json out = field<json>(j, "out", what);
    if (!out.is_object()) throw ProtocolError("node state has a malformed 'out'");
    n.sittingOut = SittingOut{.cause = field<std::string>(out, "cause", what),
                              .reason = field<std::string>(out, "why", what)};
  }
  return n;
}

std::string encode(const JobEvent& e) {
  return json{{"seq", e.seq},     {"time", e.time}, {"kind", e.kind},     {"node", e.node},
              {"round", e.round}, {"rank", e.rank}, {"detail", e.detail}, {"agent", e.agent}}
      .dump();
}

JobEvent decodeEvent(std::string_view text) {
  static constexpr const char* what = "job event";
  const json j = parse(text, what);
  return {.seq = field<int64_t>(j, "seq", what),
          .time = field<double>(j, "time", what),
          .kind = field<std::string>(j, "kind", what),
          .node = field<std::string>(j, "node", what),
          .round = field<int>(j, "round", what),
          .rank = field<int>(j, "rank", what),
          .detail = field<std::string>(j, "detail", what),
          .agent = field<int>(j, "agent", what)};
}

std::vector<std::string> lines(std::string_view text) {
  std::vector<std::string> out;
  std::set<std::string> seen;
  while (!text.empty()) {
    const size_t end = text.find('\n');
    const std::string line(text.substr(0, end));
    if (!line.empty() && seen.insert(line).second) out.push_back(line);
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return out;
}

}  // namespace dlrun::control
