// Several roles in one job (agents/roles.h): parsing --roles, each worker's role rank, and
// TF_CONFIG as TensorFlow's TFConfigClusterResolver reads it for ParameterServerStrategy.
#include "agents/roles.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "agents/worker_env.h"
#include "common/error.h"

namespace dlrun::agents {
namespace {

TEST(Roles, ParseNamesCountsAndMarks) {
  const auto roles = parseRoles("ps:2:service,worker:4:alone,evaluator:1:alone:service");
  ASSERT_EQ(roles.size(), 3u);
  EXPECT_EQ(roles[0].name, "ps");
  EXPECT_EQ(roles[0].count, 2);
  EXPECT_TRUE(roles[0].service);
  EXPECT_FALSE(roles[0].alone);
  EXPECT_TRUE(roles[1].alone);
  EXPECT_FALSE(roles[1].service);
  EXPECT_TRUE(roles[2].alone && roles[2].service);
  EXPECT_EQ(workerCount(roles), 7);
  EXPECT_EQ(roleOfLocal(roles, 1).name, "ps");
  EXPECT_EQ(roleOfLocal(roles, 2).name, "worker");
  EXPECT_EQ(roleOfLocal(roles, 6).name, "evaluator");
  EXPECT_EQ(roleNames(parseRoles("ps:1,worker:2")),
            (std::vector<std::string>{"ps", "worker", "worker"}));
}

TEST(Roles, MalformedStringsAreConfigErrors) {
  for (const char* bad : {"", "ps", "ps:", "ps:0", "ps:-1", "ps:x", "ps:1,ps:2", ":1", "p s:1",
                          "ps:1:forever", "ps:1,,worker:2", "ps:99999999999"}) {
    EXPECT_THROW(parseRoles(bad), ConfigError) << bad;
  }
}

TEST(Roles, OnlyServicesParseButEndNoJobOfOneNode) {
  const auto services = parseRoles("ps:1:service,worker:2:service");
  EXPECT_THROW(requireEndingRole(services, "ps:1:service,worker:2:service"), ConfigError);
  EXPECT_NO_THROW(requireEndingRole(parseRoles("chief:1,ps:1:service"), "chief:1,ps:1:service"));
}

TEST(Roles, RoleRanksFollowRanksAndTheFirstWorkerIsChief) {
  const std::vector<std::string> byRank = {"ps", "worker", "worker", "ps", "worker", "worker"};
  const auto places = placeRoles(byRank, 3, 3);  // node 1 of 2 with ps:1,worker:2
  ASSERT_EQ(places.size(), 3u);
  EXPECT_EQ(places[0].name, "ps");
  EXPECT_EQ(places[0].rank, 1);
  EXPECT_EQ(places[0].worldSize, 2);
  EXPECT_EQ(places[0].tfType, "ps");
  EXPECT_EQ(places[0].tfIndex, 1);
  EXPECT_EQ(places[1].rank, 2);
  EXPECT_EQ(places[1].worldSize, 4);
  EXPECT_EQ(places[1].tfType, "worker");
  EXPECT_EQ(places[1].tfIndex, 1);  // worker 0 is the chief
  const auto first = placeRoles(byRank, 0, 3);
  EXPECT_EQ(first[1].tfType, "chief");
  EXPECT_EQ(first[1].tfIndex, 0);
  EXPECT_EQ(first[2].tfType, "worker");
  EXPECT_EQ(first[2].tfIndex, 0);
  EXPECT_THROW(placeRoles(byRank, 4, 3), ConfigError);
}

TEST(Roles, AChiefRoleKeepsEveryWorkerAWorker) {
  const auto places = placeRoles({"chief", "worker", "worker"}, 0, 3);
  EXPECT_EQ(places[0].tfType, "chief");
  EXPECT_EQ(places[1].tfType, "worker");
  EXPECT_EQ(places[1].tfIndex, 0);
  EXPECT_EQ(
      nlohmann::json::parse(tfClusterOfRoles({"a:1", "b:2", "c:3"}, {"chief", "worker", "worker"})),
      nlohmann::json::parse(R"({"chief":["a:1"],"worker":["b:2","c:3"]})"));
}

// TFConfigClusterResolver's rules: the task's type is a job of the cluster and its index is in
// range; every task sees the same cluster; no address appears twice.
TEST(Roles, TfConfigOfPsAndWorkersOnTwoNodes) {
  rendezvous::World world;
  world.worldSize = 8;
  world.localWorldSize = 4;
  world.workerEndpoints = {"10.0.0.1:1", "10.0.0.1:2", "10.0.0.1:3", "10.0.0.1:4",
                           "10.0.0.2:1", "10.0.0.2:2", "10.0.0.2:3", "10.0.0.2:4"};
  world.workerRoles = {"ps", "worker", "worker", "worker", "ps", "worker", "worker", "worker"};
  std::set<std::pair<std::string, int>> tasks;
  nlohmann::json first;
  for (int rank = 0; rank < 8; ++rank) {
    world.baseRank = rank < 4 ? 0 : 4;
    const auto env = workerEnvironment({}, world, {}, rank % 4);
    const auto config = nlohmann::json::parse(env.at("TF_CONFIG"));
    if (rank == 0) first = config["cluster"];
    EXPECT_EQ(config["cluster"], first);
    const std::string type = config["task"]["type"];
    const int index = config["task"]["index"];
    ASSERT_TRUE(config["cluster"].contains(type));
    EXPECT_LT(index, static_cast<int>(config["cluster"][type].size()));
    EXPECT_TRUE(tasks.emplace(type, index).second);
    EXPECT_EQ(env.at("ROLE_NAME"), world.workerRoles[rank]);
  }
  EXPECT_EQ(first["chief"], nlohmann::json({"10.0.0.1:2"}));
  EXPECT_EQ(first["ps"], nlohmann::json({"10.0.0.1:1", "10.0.0.2:1"}));
  EXPECT_EQ(first["worker"].size(), 5u);
  EXPECT_EQ(tasks.size(), 8u);
}

}  // namespace
}  // namespace dlrun::agents
