// mpirun discovery: Open MPI's and PMIx's variables (as mpirun 4.1 sets them) and the user's
// flags give the expected settings; malformed or missing values are refused naming the variable.
#include "mpi/discovery.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dlrun::mpi {
namespace {

// What Open MPI 4.1's mpirun -np 3 sets for process `rank` (one a host), with -x MASTER_ADDR.
Environment launched(int rank = 1) {
  return {{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
          {"OMPI_COMM_WORLD_SIZE", "3"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
          {"OMPI_COMM_WORLD_NODE_RANK", "0"},
          {"OMPI_MCA_ess_base_jobid", "1615790081"},
          {"PMIX_RANK", std::to_string(rank)},
          {"PMIX_NAMESPACE", "1615790081"},
          {"MASTER_ADDR", "node1"}};
}

std::string errorOf(const Environment& env, const UserFlags& user = {}) {
  try {
    mpi::discover(env, user);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(MpiDiscovery, DetectedByOpenMpiOrPmixUnlessTurnedOff) {
  EXPECT_TRUE(mpi::detected(launched()));
  EXPECT_TRUE(mpi::detected({{"PMIX_RANK", "0"}}));
  EXPECT_FALSE(mpi::detected({{"SLURM_JOB_ID", "1"}}));
  Environment off = launched();
  off["DLRUN_MPI"] = "0";
  EXPECT_FALSE(mpi::detected(off));
  off["DLRUN_MPI"] = "yes";
  EXPECT_THROW(mpi::detected(off), ConfigError);
}

TEST(MpiDiscovery, WorldFromOpenMpi) {
  const Settings s = mpi::discover(launched(2), {});
  EXPECT_EQ(s.rdzvId, "mpi-1615790081");
  EXPECT_EQ(s.nodeRank, 2);
  EXPECT_EQ(s.nnodes, 3);
  ASSERT_TRUE(s.endpoint);
  EXPECT_EQ(s.endpoint.value().host, "node1");
  EXPECT_GE(s.endpoint.value().port, discovery::kPortBase);
  EXPECT_LT(s.endpoint.value().port, discovery::kPortBase + discovery::kPortRange);
  // Every process of the job derives the same port.
  EXPECT_EQ(mpi::discover(launched(0), {}).endpoint.value().port, s.endpoint.value().port);
}

TEST(MpiDiscovery, MasterPortWins) {
  Environment env = launched();
  env["MASTER_PORT"] = "29555";
  EXPECT_EQ(mpi::discover(env, {}).endpoint.value().port, 29555);
  env["MASTER_PORT"] = "70000";
  EXPECT_NE(errorOf(env).find("MASTER_PORT='70000'"), std::string::npos);
}

TEST(MpiDiscovery, FlagsWin) {
  const Settings s = mpi::discover(
      launched(), {.nnodes = true, .nodeRank = true, .rdzvEndpoint = true, .rdzvId = true});
  EXPECT_FALSE(s.rdzvId);
  EXPECT_FALSE(s.nodeRank);
  EXPECT_FALSE(s.nnodes);
  EXPECT_FALSE(s.endpoint);
}

TEST(MpiDiscovery, PmixAlone) {
  const Environment pmix{
      {"PMIX_RANK", "1"}, {"PMIX_NAMESPACE", "prterun-h-77@1"}, {"MASTER_ADDR", "10.0.0.1"}};
  EXPECT_NE(errorOf(pmix).find("pass --nnodes"), std::string::npos);
  const Settings s = mpi::discover(pmix, {.nnodes = true});
  EXPECT_EQ(s.nodeRank, 1);
  EXPECT_EQ(s.rdzvId, "mpi-prterun-h-77@1");
}

TEST(MpiDiscovery, RefusesWhatCannotWork) {
  Environment env = launched();
  env.erase("MASTER_ADDR");
  EXPECT_NE(errorOf(env).find("MASTER_ADDR"), std::string::npos);
  EXPECT_EQ(errorOf(env, {.rdzvEndpoint = true}), "");
  env = launched();
  env["OMPI_COMM_WORLD_RANK"] = "x";
  EXPECT_NE(errorOf(env).find("OMPI_COMM_WORLD_RANK='x'"), std::string::npos);
  env = launched();
  env["OMPI_COMM_WORLD_SIZE"] = "0";
  EXPECT_NE(errorOf(env).find("OMPI_COMM_WORLD_SIZE='0'"), std::string::npos);
}

}  // namespace
}  // namespace dlrun::mpi
