#include "agents/roles.h"

#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "common/text.h"

namespace dlrun::agents {
namespace {

constexpr std::string_view kChief = "chief";
constexpr std::string_view kWorker = "worker";

std::vector<std::string_view> split(std::string_view text, char by) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t at = text.find(by, start);
    parts.push_back(text.substr(start, at - start));
    if (at == std::string_view::npos) return parts;
    start = at + 1;
  }
}

[[noreturn]] void bad(std::string_view text, const std::string& why) {
  throw ConfigError("--roles '" + std::string(text) + "': " + why +
                    " (expected NAME:COUNT[:service][:alone],..., e.g. ps:1:service,worker:2)");
}

// The first worker is the chief when no role is called so.
bool promotesFirstWorker(const std::vector<std::string>& roleOfRank) {
  bool chief = false, worker = false;
  for (const auto& role : roleOfRank) {
    chief = chief || role == kChief;
    worker = worker || role == kWorker;
  }
  return worker && !chief;
}

}  // namespace

std::vector<RoleSpec> parseRoles(std::string_view text) {
  std::vector<RoleSpec> roles;
  std::set<std::string, std::less<>> names;
  for (std::string_view item : split(text, ',')) {
    const auto fields = split(item, ':');
    if (fields.size() < 2) bad(text, "'" + std::string(item) + "' has no count");
    RoleSpec role{.name = std::string(fields[0])};
    if (role.name.empty() ||
        role.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                    "0123456789_-") != std::string::npos)
      bad(text, "role name '" + role.name + "' is not a word");
    if (!names.insert(role.name).second) bad(text, "role '" + role.name + "' appears twice");
    const auto count = fields[1];
    role.count = parseInteger<int>(count).value_or(0);
    if (role.count < 1 || role.count > 1 << 20)
      bad(text,
          "count '" + std::string(count) + "' of role " + role.name + " is not a positive integer");
    for (size_t i = 2; i < fields.size(); ++i) {
      if (fields[i] == "service")
        role.service = true;
      else if (fields[i] == "alone")
        role.alone = true;
      else
        bad(text, "unknown mark '" + std::string(fields[i]) + "' of role " + role.name);
    }
    roles.push_back(std::move(role));
  }
  return roles;
}

void requireEndingRole(const std::vector<RoleSpec>& roles, std::string_view text) {
  bool ends = false;
  for (const auto& role : roles) ends = ends || !role.service;
  if (!ends) bad(text, "every role is a service, so nothing would end the job");
}

int workerCount(const std::vector<RoleSpec>& roles) {
  int count = 0;
  for (const auto& role : roles) count += role.count;
  return count;
}

const RoleSpec& roleOfLocal(const std::vector<RoleSpec>& roles, int localRank) {
  for (const auto& role : roles) {
    if (localRank < role.count) return role;
    localRank -= role.count;
  }
  throw Error("local rank beyond the node's roles");
}

std::vector<std::string> roleNames(const std::vector<RoleSpec>& roles) {
  std::vector<std::string> names;
  for (const auto& role : roles) names.insert(names.end(), role.count, role.name);
  return names;
}

std::vector<RolePlace> placeRoles(const std::vector<std::string>& roleOfRank, int first,
                                  int count) {
  if (first < 0 || first + count > static_cast<int>(roleOfRank.size()))
    throw ConfigError("the round's roles cover " + std::to_string(roleOfRank.size()) +
                      " workers, not ranks " + std::to_string(first) + "-" +
                      std::to_string(first + count - 1));
  std::map<std::string, int, std::less<>> sizes, seen;
  for (const auto& role : roleOfRank) ++sizes[role];
  const bool promote = promotesFirstWorker(roleOfRank);
  std::vector<RolePlace> places;
  places.reserve(count);
  for (int rank = 0; rank < first + count; ++rank) {
    const std::string& name = roleOfRank[rank];
    const int roleRank = seen[name]++;
    if (rank < first) continue;
    RolePlace place{name, roleRank, sizes[name], name, roleRank};
    if (promote && name == kWorker) {
      place.tfType = roleRank == 0 ? kChief : kWorker;
      place.tfIndex = roleRank == 0 ? 0 : roleRank - 1;
    }
    places.push_back(std::move(place));
  }
  return places;
}

std::string tfClusterOfRoles(const std::vector<std::string>& endpoints,
                             const std::vector<std::string>& roleOfRank) {
  if (endpoints.size() != roleOfRank.size())
    throw Error("the round has " + std::to_string(endpoints.size()) + " worker endpoints for " +
                std::to_string(roleOfRank.size()) + " roles");
  const bool promote = promotesFirstWorker(roleOfRank);
  nlohmann::json cluster = nlohmann::json::object();
  bool chiefTaken = false;
  for (size_t rank = 0; rank < endpoints.size(); ++rank) {
    std::string type = roleOfRank[rank];
    if (promote && type == kWorker && !chiefTaken) {
      type = kChief;
      chiefTaken = true;
    }
    cluster[type].push_back(endpoints[rank]);
  }
  return cluster.dump();
}

}  // namespace dlrun::agents
