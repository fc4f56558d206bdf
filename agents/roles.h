// Several roles in one job (--roles ps:2:service,worker:4:alone): what each worker of a node
// runs as, its rank within its role, and TF_CONFIG for TensorFlow's ParameterServerStrategy.
// Pure: the launcher parses, the agent lays out a round's roles from the World.
//
// A node's workers take its roles in the order given (local ranks 0-1 ps, 2-5 worker above);
// every node publishes its workers' role names with its record, so a round knows the role of
// every RANK. A role's rank orders its workers by RANK across the job. In TF_CONFIG every role
// is a list of the cluster; the first worker is the `chief` unless a role is named chief.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dlrun::agents {

struct RoleSpec {
  std::string name;
  int count = 1;
  // `service`: its workers serve the others and never end the job by themselves: this node's
  // part is done when its other workers exited 0, and they are stopped when the job ends.
  bool service = false;
  // `alone`: a failed worker is restarted alone (counted against --max-restarts) while the
  // round goes on, where the others do not depend on it (parameter-server workers).
  bool alone = false;
};

// "NAME:COUNT[:service][:alone],..." in local-rank order; throws ConfigError naming the flag.
std::vector<RoleSpec> parseRoles(std::string_view text);
// A job of one node needs a role that is no service, or nothing would end it; throws ConfigError.
// On several nodes a node may run services only (TensorFlow's parameter servers on their own
// nodes): the others' roles end the job.
void requireEndingRole(const std::vector<RoleSpec>& roles, std::string_view text);
int workerCount(const std::vector<RoleSpec>& roles);
// The role of each local rank.
const RoleSpec& roleOfLocal(const std::vector<RoleSpec>& roles, int localRank);
// One role name per local rank, as a NodeRecord publishes them.
std::vector<std::string> roleNames(const std::vector<RoleSpec>& roles);

// One worker's place among the roles of the round.
struct RolePlace {
  std::string name;
  int rank = 0;        // ROLE_RANK
  int worldSize = 1;   // ROLE_WORLD_SIZE
  std::string tfType;  // TF_CONFIG's task: "chief" for the first worker, else the role's name
  int tfIndex = 0;
};

// The places of ranks [first, first + count) given every RANK's role name (the round's).
// Throws ConfigError when the roles do not cover the job.
std::vector<RolePlace> placeRoles(const std::vector<std::string>& roleOfRank, int first, int count);

// TF_CONFIG's cluster part: {"chief":[...],"ps":[...],"worker":[...]} from each RANK's endpoint
// and role, the first worker moved to chief as placeRoles() does.
std::string tfClusterOfRoles(const std::vector<std::string>& endpoints,
                             const std::vector<std::string>& roleOfRank);

}  // namespace dlrun::agents
