#include "store/prefix_store.h"

#include <gtest/gtest.h>

#include "store/memory_store.h"

namespace dlrun::rendezvous {
namespace {

using namespace std::chrono_literals;

TEST(PrefixStore, NamespacesEveryKey) {
  auto inner = std::make_shared<MemoryStore>();
  PrefixStore job1("job1", inner), job2("job2", inner);
  job1.set("k", "1");
  job2.set("k", "2");
  EXPECT_EQ(inner->get("job1/k"), "1");
  EXPECT_EQ(job2.get("k"), "2");
  EXPECT_EQ(job1.add("n", 5), 5);
  EXPECT_EQ(inner->get("job1/n"), "5");
  EXPECT_EQ(job1.compareSet("k", "1", "3"), "3");
  job1.append("k", "4");
  job1.multiSet({"a", "b"}, {"x", "y"});
  EXPECT_EQ(job1.multiGet({"k", "a", "b"}), (std::vector<std::string>{"34", "x", "y"}));
  EXPECT_TRUE(job1.check({"a", "b"}));
  EXPECT_FALSE(job2.check({"a"}));
  job1.wait({"a"}, 1s);
  EXPECT_TRUE(job1.deleteKey("a"));
  EXPECT_TRUE(inner->check({"job1/b"}));
  EXPECT_FALSE(inner->check({"job1/a"}));
}

TEST(PrefixStore, NestsPrefixes) {
  auto inner = std::make_shared<MemoryStore>();
  auto run = std::make_shared<PrefixStore>("run", inner);
  PrefixStore round(std::string("round0"), run);
  round.set("k", "v");
  EXPECT_EQ(inner->get("run/round0/k"), "v");
}

}  // namespace
}  // namespace dlrun::rendezvous
