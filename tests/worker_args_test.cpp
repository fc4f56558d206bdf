// Each worker's argv (agents/worker_args.h): torchrun's ${local_rank} macro, substituted as
// Python's string.Template.safe_substitute does, and --use-local-rank-arg's flag.
#include "agents/worker_args.h"

#include <gtest/gtest.h>

namespace dlrun::agents {
namespace {

using Args = std::vector<std::string>;

TEST(SubstituteLocalRank, BothFormsAndTheEscape) {
  EXPECT_EQ(substituteLocalRank("--rank=${local_rank}", 3), "--rank=3");
  EXPECT_EQ(substituteLocalRank("/data/$local_rank/x", 12), "/data/12/x");
  EXPECT_EQ(substituteLocalRank("$local_rank.$local_rank", 1), "1.1");
  EXPECT_EQ(substituteLocalRank("cost $$5 and $$local_rank", 0), "cost $5 and $local_rank");
}

TEST(SubstituteLocalRank, OtherNamesAndStraySignsStayAsWritten) {
  EXPECT_EQ(substituteLocalRank("$local_ranks ${rank} $HOME", 2), "$local_ranks ${rank} $HOME");
  EXPECT_EQ(substituteLocalRank("${local_rank", 2), "${local_rank");
  EXPECT_EQ(substituteLocalRank("a$ b$", 2), "a$ b$");
  EXPECT_EQ(substituteLocalRank("no macro", 2), "no macro");
  EXPECT_EQ(substituteLocalRank("", 2), "");
}

TEST(WorkerArgv, TheProgramIsKeptAndTheFlagAppended) {
  EXPECT_EQ(workerArgv({"/bin/$local_rank", "-u", "x${local_rank}.py"}, 1, "", 1),
            (Args{"/bin/$local_rank", "-u", "x1.py"}));
  EXPECT_EQ(workerArgv({"python3", "train.py"}, 2, "--local-rank", 0),
            (Args{"python3", "train.py", "--local-rank=0"}));
}

}  // namespace
}  // namespace dlrun::agents
