#include "rendezvous/elastic_protocol.h"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <ctime>
#include <nlohmann/json.hpp>
#include <numeric>

#include "common/error.h"
#include "common/host_port.h"
#include "common/text.h"
#include "store/json_fields.h"

namespace dlrun::rendezvous::elastic {

std::vector<std::string> Keys::ofRound(int round, int joined,
                                       const std::vector<std::string>& members) const {
  std::vector<std::string> keys{this->joined(round), closer(round), closed(round),
                                roster(round),       done(round),   spares(round),
                                names(round),        gaveUp(round), this->members(round)};
  for (int i = 1; i <= joined; ++i) {
    keys.push_back(node(round, i));
    for (RoundTopic topic : kRoundTopics) keys.push_back(shared(round, topic, i));
    keys.push_back(succeeded(round, i));
  }
  for (const auto& member : members) keys.push_back(assignment(round, member));
  // The end last, after the assignments: a late report that finds its assignment wrote its end
  // before the end went (ElasticImpl::endRound).
  keys.push_back(end(round));
  return keys;
}

std::string Keys::shared(int round, RoundTopic topic, int index) const {
  static constexpr std::string_view kLeaves[] = {"hang/", "probe-at/", "probe/", "failures/"};
  static_assert(std::size(kLeaves) == std::size(kRoundTopics));
  return roundKey(round, std::string(kLeaves[static_cast<int>(topic)]) + std::to_string(index));
}

namespace {

using json_fields::field;
using json_fields::parse;
using nlohmann::json;

// nlohmann converts 70000 to a uint16_t without a word: a port is read as an int and checked.
uint16_t portField(const json& object, const char* name, const char* what) {
  const int port = field<int>(object, name, what);
  if (port < 1 || port > 65535)
    throw ProtocolError(std::string(what) + " has a malformed '" + name + "'");
  return static_cast<uint16_t>(port);
}

// Addresses compare as numbers (10.0.0.9 before 10.0.0.10), IPv4 before IPv6; a name that is
// not numeric sorts after both, by its text.
struct AddressKey {
  int family;
  std::array<unsigned char, 16> bytes{};
  std::string text;
  auto operator<=>(const AddressKey&) const = default;
};

AddressKey addressKey(const std::string& addr) {
  AddressKey key{2, {}, addr};
  if (inet_pton(AF_INET, addr.c_str(), key.bytes.data()) == 1)
    key.family = 0;
  else if (inet_pton(AF_INET6, addr.c_str(), key.bytes.data()) == 1)
    key.family = 1;
  return key;
}

const char* kindName(RoundEnd::Kind kind) {
  switch (kind) {
    case RoundEnd::Kind::NodeLost: return "lost";
    case RoundEnd::Kind::NodeJoined: return "joined";
    case RoundEnd::Kind::NodeLeft: return "left";
    case RoundEnd::Kind::WorkerFailed: return "failed";
    case RoundEnd::Kind::Finished: return "finished";
    case RoundEnd::Kind::Stopped: return "stopped";
    case RoundEnd::Kind::StoreLost: return "store-lost";
  }
  return "?";
}

}  // namespace

std::string encode(const NodeRecord& r) {
  json j = {{"id", r.id},       {"addr", r.addr},         {"name", r.name},
            {"nproc", r.nproc}, {"ports", r.workerPorts}, {"failures", r.failures}};
  if (r.rankHint) j["hint"] = *r.rankHint;
  if (r.lastGroupRank) j["last"] = *r.lastGroupRank;
  if (r.storePort) j["store"] = *r.storePort;
  if (!r.roles.empty()) j["roles"] = r.roles;
  if (r.kept)
    j["kept"] = {{"space", r.kept->spaceRound},     {"group_rank", r.kept->groupRank},
                 {"nodes", r.kept->groupWorldSize}, {"base_rank", r.kept->baseRank},
                 {"world_size", r.kept->worldSize}, {"ports", r.kept->workerPorts}};
  return j.dump();
}

std::string nodeName(const NodeRecord& record) { return record.name + " (" + record.addr + ")"; }

NodeRecord decodeNodeRecord(std::string_view text) {
  static constexpr const char* what = "node record";
  const json j = parse(text, what);
  NodeRecord r;
  r.id = field<std::string>(j, "id", what);
  r.addr = field<std::string>(j, "addr", what);
  r.name = field<std::string>(j, "name", what);
  r.nproc = field<int>(j, "nproc", what);
  r.workerPorts = field<std::vector<uint16_t>>(j, "ports", what);
  r.failures = field<int>(j, "failures", what);
  if (j.contains("hint")) r.rankHint = field<int>(j, "hint", what);
  if (j.contains("last")) r.lastGroupRank = field<int>(j, "last", what);
  if (j.contains("store")) r.storePort = portField(j, "store", what);
  if (j.contains("roles")) r.roles = field<std::vector<std::string>>(j, "roles", what);
  if (j.contains("kept")) {
    const json& k = field<json>(j, "kept", what);
    r.kept = KeptWorkers{
        field<int>(k, "space", what),      field<int>(k, "group_rank", what),
        field<int>(k, "nodes", what),      field<int>(k, "base_rank", what),
        field<int>(k, "world_size", what), field<std::vector<uint16_t>>(k, "ports", what)};
  }
  // The id names a key: never empty, never a path.
  if (r.id.empty() || r.id.find('/') != std::string::npos)
    throw ProtocolError("node record of " + r.addr + " has a malformed id");
  if (r.nproc < 1 || r.workerPorts.size() != static_cast<size_t>(r.nproc) ||
      (!r.roles.empty() && r.roles.size() != r.workerPorts.size()))
    throw ProtocolError("node record of " + r.addr + " has an inconsistent worker count");
  if (r.kept && (r.kept->workerPorts != r.workerPorts || r.kept->groupRank < 0 ||
                 r.kept->groupRank >= r.kept->groupWorldSize || r.kept->baseRank < 0 ||
                 r.kept->baseRank + r.nproc > r.kept->worldSize))
    throw ProtocolError("node record of " + r.addr + " keeps workers it cannot have");
  return r;
}

std::string encode(const Assignment& a) {
  json j = {{"group_rank", a.groupRank},
            {"group_world_size", a.groupWorldSize},
            {"base_rank", a.baseRank},
            {"world_size", a.worldSize},
            {"failures", a.failures}};
  if (a.masterAddr) j["master_addr"] = *a.masterAddr;
  if (a.masterPort) j["master_port"] = *a.masterPort;
  if (a.keptSpace) j["kept_space"] = *a.keptSpace;
  if (a.joins) j["joins"] = true;
  return j.dump();
}

Assignment decodeAssignment(std::string_view text) {
  static constexpr const char* what = "rank assignment";
  const json j = parse(text, what);
  Assignment a{field<int>(j, "group_rank", what), field<int>(j, "group_world_size", what),
               field<int>(j, "base_rank", what), field<int>(j, "world_size", what),
               field<int>(j, "failures", what)};
  if (j.contains("master_addr")) a.masterAddr = field<std::string>(j, "master_addr", what);
  if (j.contains("master_port")) a.masterPort = portField(j, "master_port", what);
  if (a.masterAddr.has_value() != a.masterPort.has_value())
    throw ProtocolError("rank assignment has a workers' store address without its port");
  if (j.contains("kept_space")) a.keptSpace = field<int>(j, "kept_space", what);
  if (j.contains("joins")) a.joins = field<bool>(j, "joins", what);
  if (a.joins && !a.keptSpace) throw ProtocolError("rank assignment joins workers no round kept");
  return a;
}

namespace {

int mostFailures(const std::vector<NodeRecord>& byArrival) {
  int failures = 0;
  for (const NodeRecord& r : byArrival) failures = std::max(failures, r.failures);
  return failures;
}

// The workers' store goes with the node that serves it (etcd: group rank 0's agent).
void nameWorkersStore(Assignment& a, const NodeRecord& groupRankZero) {
  if (!groupRankZero.storePort) return;
  a.masterAddr = groupRankZero.addr;
  a.masterPort = *groupRankZero.storePort;
}

// The plan that keeps running workers (planRound), or nothing. `order` is the arrival indices
// in the usual order: the newcomers take the lost places in it. Without newcomers, a smaller
// round keeps every member's workers in their old order, renumbered from 0.
std::optional<Plan> planKept(const std::vector<NodeRecord>& byArrival,
                             const std::vector<int>& order) {
  const auto keeper = std::find_if(byArrival.begin(), byArrival.end(),
                                   [](const NodeRecord& r) { return r.kept.has_value(); });
  if (keeper == byArrival.end()) return std::nullopt;
  const KeptWorkers& was = *keeper->kept;
  const int members = static_cast<int>(byArrival.size());
  const bool everyoneKept = std::all_of(byArrival.begin(), byArrival.end(),
                                        [](const NodeRecord& r) { return r.kept.has_value(); });
  const bool refilled = members == was.groupWorldSize;
  if (!refilled && !(everyoneKept && members < was.groupWorldSize)) return std::nullopt;
  std::vector<int> place(was.groupWorldSize, -1);  // old group rank -> arrival index
  for (int i = 0; i < members; ++i) {
    const NodeRecord& r = byArrival[i];
    if (!r.roles.empty()) return std::nullopt;
    if (!r.kept) continue;
    const KeptWorkers& k = *r.kept;
    if (k.spaceRound != was.spaceRound || k.groupWorldSize != was.groupWorldSize ||
        k.worldSize != was.worldSize || place[k.groupRank] != -1)
      return std::nullopt;
    place[k.groupRank] = i;
  }
  if (refilled) {
    // As many newcomers as lost places: members == places, and each keeper holds its own.
    auto newcomer = order.begin();
    for (int& i : place) {
      if (i != -1) continue;
      newcomer = std::find_if(newcomer, order.end(), [&](int j) { return !byArrival[j].kept; });
      i = *newcomer++;
    }
  } else {
    place.erase(std::remove(place.begin(), place.end(), -1), place.end());
  }
  // The workers' store must still be there, with its node (etcd: old group rank 0's).
  const NodeRecord& first = byArrival[place[0]];
  if (first.storePort && !(first.kept && first.kept->groupRank == 0)) return std::nullopt;
  Plan plan;
  plan.byArrival.resize(members);
  const int failures = mostFailures(byArrival);
  int worldSize = 0;
  for (const NodeRecord& r : byArrival) worldSize += r.nproc;
  int baseRank = 0;
  for (int groupRank = 0; groupRank < members; ++groupRank) {
    const NodeRecord& r = byArrival[place[groupRank]];
    // Refilled, every rank keeps its number: the newcomers' counts must fit the lost places.
    if (refilled && r.kept && r.kept->baseRank != baseRank) return std::nullopt;
    Assignment& a = plan.byArrival[place[groupRank]];
    a = {groupRank, members, baseRank, worldSize, failures};
    nameWorkersStore(a, first);
    a.keptSpace = was.spaceRound;
    a.joins = !r.kept;
    for (uint16_t port : r.workerPorts) plan.roster.endpoints.push_back(joinHostPort(r.addr, port));
    baseRank += r.nproc;
  }
  if (refilled && worldSize != was.worldSize) return std::nullopt;
  return plan;
}

}  // namespace

Plan planRound(const std::vector<NodeRecord>& byArrival) {
  const int members = static_cast<int>(byArrival.size());
  std::vector<int> order(members);
  std::iota(order.begin(), order.end(), 0);
  auto sortKey = [&](int i) {
    const NodeRecord& r = byArrival[i];
    return std::tuple(r.rankHint.value_or(INT32_MAX), addressKey(r.addr),
                      r.lastGroupRank.value_or(INT32_MAX), i);
  };
  std::sort(order.begin(), order.end(), [&](int a, int b) { return sortKey(a) < sortKey(b); });
  if (auto kept = planKept(byArrival, order)) return std::move(*kept);

  int worldSize = 0, withRoles = 0;
  for (const NodeRecord& r : byArrival) {
    worldSize += r.nproc;
    withRoles += r.roles.empty() ? 0 : 1;
  }
  const int failures = mostFailures(byArrival);
  Plan plan;
  plan.byArrival.resize(members);
  int baseRank = 0;
  for (int groupRank = 0; groupRank < members; ++groupRank) {
    const NodeRecord& r = byArrival[order[groupRank]];
    Assignment& a = plan.byArrival[order[groupRank]];
    a = {groupRank, members, baseRank, worldSize, failures};
    nameWorkersStore(a, byArrival[order[0]]);
    for (uint16_t port : r.workerPorts) plan.roster.endpoints.push_back(joinHostPort(r.addr, port));
    // A node without --roles in a job with them: its workers take the role "worker".
    if (withRoles > 0) {
      if (r.roles.empty())
        plan.roster.roles.insert(plan.roster.roles.end(), r.nproc, "worker");
      else
        plan.roster.roles.insert(plan.roster.roles.end(), r.roles.begin(), r.roles.end());
    }
    baseRank += r.nproc;
  }
  return plan;
}

std::string encodeRoster(const Roster& roster) {
  if (roster.roles.empty()) return json(roster.endpoints).dump();
  return json{{"endpoints", roster.endpoints}, {"roles", roster.roles}}.dump();
}

Roster decodeRoster(std::string_view text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  try {
    if (j.is_array()) return {j.get<std::vector<std::string>>(), {}};
    if (j.is_object()) {
      Roster roster{j.at("endpoints").get<std::vector<std::string>>(),
                    j.at("roles").get<std::vector<std::string>>()};
      if (roster.roles.size() == roster.endpoints.size()) return roster;
    }
  } catch (const json::exception&) {
  }
  throw ProtocolError("malformed worker roster in the store");
}

std::string encode(const RoundEnd& e) {
  json j = {{"kind", kindName(e.kind)}, {"node", e.node}};
  if (e.kind == RoundEnd::Kind::WorkerFailed) {
    j["rank"] = e.rank;
    j["code"] = e.exitCode;
    if (e.signal) j["signal"] = e.signal;
    j["failures"] = e.failures;
    j["final"] = e.final;
    j["report"] = e.report;
    if (e.hang) j["hang"] = true;
  } else if (e.kind == RoundEnd::Kind::Stopped) {
    j["code"] = e.exitCode;
    j["report"] = e.report;
  }
  return j.dump();
}

RoundEnd decodeRoundEnd(std::string_view text) {
  static constexpr const char* what = "round end";
  const json j = parse(text, what);
  RoundEnd e;
  const auto kind = field<std::string>(j, "kind", what);
  e.node = field<std::string>(j, "node", what);
  for (auto k : {RoundEnd::Kind::NodeLost, RoundEnd::Kind::NodeJoined, RoundEnd::Kind::NodeLeft,
                 RoundEnd::Kind::WorkerFailed, RoundEnd::Kind::Finished, RoundEnd::Kind::Stopped}) {
    if (kind == kindName(k)) e.kind = k;
  }
  if (kind != kindName(e.kind)) throw ProtocolError("unknown round end '" + kind + "'");
  if (e.kind == RoundEnd::Kind::WorkerFailed) {
    e.rank = field<int>(j, "rank", what);
    e.exitCode = field<int>(j, "code", what);
    if (j.contains("signal")) e.signal = field<int>(j, "signal", what);
    e.failures = field<int>(j, "failures", what);
    e.final = field<bool>(j, "final", what);
    e.report = field<std::string>(j, "report", what);
    if (j.contains("hang")) e.hang = field<bool>(j, "hang", what);
  } else if (e.kind == RoundEnd::Kind::Stopped) {
    e.exitCode = field<int>(j, "code", what);
    e.final = true;
    e.report = field<std::string>(j, "report", what);
  }
  return e;
}

std::optional<RoundEnd> endedJob(std::string_view stop, std::string_view newestEnd) {
  if (!stop.empty()) return decodeRoundEnd(stop);
  if (newestEnd.empty()) return std::nullopt;
  RoundEnd end = decodeRoundEnd(newestEnd);
  if (!end.endsJob()) return std::nullopt;  // a restart or a change of members: it goes on
  return end;
}

std::string encode(const Expiry& expiry) {
  return std::to_string(expiry.endedAt) + " " + std::to_string(expiry.ttl);
}

std::optional<Expiry> decodeExpiry(std::string_view text) {
  Expiry expiry;
  const size_t space = text.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  const auto number = [](std::string_view digits, int64_t& into) {
    into = parseInteger<int64_t>(digits).value_or(-1);
    return into >= 0;
  };
  if (!number(text.substr(0, space), expiry.endedAt) || !number(text.substr(space + 1), expiry.ttl))
    return std::nullopt;
  return expiry;
}

std::string describe(const Expiry& expiry, int64_t nowUnix, const std::string& how) {
  const auto clock = [](int64_t unix) {
    const std::time_t t = static_cast<std::time_t>(unix);
    std::tm local{};
    localtime_r(&t, &local);
    char text[16];
    std::strftime(text, sizeof text, "%H:%M:%S", &local);
    return std::string(text);
  };
  const int64_t expires = expiry.endedAt + expiry.ttl;
  return "ended at " + clock(expiry.endedAt) + " (" + how + "); its keys expire at " +
         clock(expires) + ", in " + std::to_string(std::max<int64_t>(expires - nowUnix, 0)) +
         " s (--rdzv-conf job_ttl=" + std::to_string(expiry.ttl) + ")";
}

std::string encodeShape(const Shape& shape) {
  return std::to_string(shape.minNodes) + ":" + std::to_string(shape.maxNodes) + "/p" +
         std::to_string(shape.protocol);
}

Shape decodeShape(std::string_view text) {
  Shape shape{.protocol = 1};
  const auto number = [&](std::string_view digits, int& into) {
    into = parseInteger<int>(digits).value_or(-1);
    if (into < 0)
      throw ProtocolError("malformed job shape '" + std::string(text) + "' in the store");
  };
  std::string_view range = text;
  if (const size_t slash = text.find("/p"); slash != std::string_view::npos) {
    number(text.substr(slash + 2), shape.protocol);
    range = text.substr(0, slash);
  }
  const size_t colon = range.find(':');
  if (colon == std::string_view::npos)
    throw ProtocolError("malformed job shape '" + std::string(text) + "' in the store");
  number(range.substr(0, colon), shape.minNodes);
  number(range.substr(colon + 1), shape.maxNodes);
  return shape;
}

std::string encodeMembers(const std::vector<std::string>& ids) {
  std::string text;
  for (const auto& id : ids) text += id + "\n";
  return text;
}

std::vector<std::string> decodeMembers(std::string_view text) {
  std::vector<std::string> ids = split(text, '\n');
  std::erase(ids, "");  // the last line's newline
  return ids;
}

}  // namespace dlrun::rendezvous::elastic
