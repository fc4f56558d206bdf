// --strategy ps's pure part (trainer/ps_layout.h): shard ranges and a process's place from
// TF_CONFIG.
#include "trainer/ps_layout.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dlrun::trainer {
namespace {

TEST(PsShards, ContiguousRangesCoverEveryParameterOnce) {
  EXPECT_EQ(shardRanges(10, 3),
            (std::vector<ShardRange>{{0, 4}, {4, 7}, {7, 10}}));  // the larger first
  EXPECT_EQ(shardRanges(235146, 1), (std::vector<ShardRange>{{0, 235146}}));
  const auto two = shardRanges(235146, 2);
  EXPECT_EQ(two[0].size(), 117573u);
  EXPECT_EQ(two[1].end, 235146u);
  EXPECT_EQ(shardRanges(3, 3).back(), (ShardRange{2, 3}));
  EXPECT_THROW(shardRanges(3, 4), ConfigError);  // a server would hold nothing
  EXPECT_THROW(shardRanges(3, 0), ConfigError);
}

TEST(PsPlace, WorkersAndServersFromTfConfig) {
  const char* cluster = R"("cluster":{"chief":["a:1"],"worker":["b:1","c:1"],"ps":["d:1","e:1"]})";
  auto place = [&](const char* task) {
    return psPlaceFromTfConfig(("{" + std::string(cluster) + ",\"task\":" + task + "}").c_str());
  };
  const PsPlace chief = place(R"({"type":"chief","index":0})");
  EXPECT_FALSE(chief.server);
  EXPECT_EQ(chief.index, 0);
  EXPECT_EQ(chief.workers, 3);
  EXPECT_EQ(chief.servers, 2);
  EXPECT_EQ(place(R"({"type":"worker","index":1})").index, 2);  // after the chief
  const PsPlace server = place(R"({"type":"ps","index":1})");
  EXPECT_TRUE(server.server);
  EXPECT_EQ(server.index, 1);
  EXPECT_THROW(place(R"({"type":"worker","index":2})"), ConfigError);  // out of range
  EXPECT_THROW(place(R"({"type":"evaluator","index":0})"), ConfigError);
}

TEST(PsPlace, MissingOrMalformedTfConfigIsAConfigError) {
  EXPECT_THROW(psPlaceFromTfConfig(nullptr), ConfigError);
  EXPECT_THROW(psPlaceFromTfConfig("not json"), ConfigError);
  EXPECT_THROW(
      psPlaceFromTfConfig(R"({"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":0}})"),
      ConfigError);  // no ps
  EXPECT_THROW(psPlaceFromTfConfig(R"({"cluster":{"ps":["a:1"]},"task":{"type":"ps","index":0}})"),
               ConfigError);  // no worker
  EXPECT_THROW(psPlaceFromTfConfig(
                   R"({"cluster":{"ps":"a:1","worker":["b:1"]},"task":{"type":"ps","index":0}})"),
               ConfigError);
}

}  // namespace
}  // namespace dlrun::trainer
