#include "rendezvous/store/memory_store.h"

#include <gtest/gtest.h>

#include <thread>

#include "common/error.h"

namespace dlrun::rendezvous {
namespace {

using namespace std::chrono_literals;

TEST(MemoryStore, SetGetAddCompareSetDelete) {
  MemoryStore store;
  store.set("a", std::string("x\0y", 3));
  EXPECT_EQ(store.get("a"), std::string("x\0y", 3));
  EXPECT_EQ(store.add("n", 3), 3);
  EXPECT_EQ(store.add("n", -1), 2);
  EXPECT_EQ(store.get("n"), "2");
  EXPECT_EQ(store.compareSet("c", "", "1"), "1");
  EXPECT_EQ(store.compareSet("c", "0", "2"), "1");
  EXPECT_EQ(store.compareSet("missing", "e", "v"), "e");
  EXPECT_TRUE(store.deleteKey("a"));
  EXPECT_FALSE(store.deleteKey("a"));
  EXPECT_EQ(store.numKeys(), 2);
  store.set("s", "abc");
  EXPECT_THROW(store.add("s", 1), Error);
}

TEST(MemoryStore, WaitReturnsWhenAnotherThreadSets) {
  MemoryStore store;
  std::thread setter([&] { store.set("k", "v"); });
  store.wait({"k"}, 10s);
  setter.join();
  EXPECT_TRUE(store.check({"k"}));
}

TEST(MemoryStore, WaitAndGetTimeOut) {
  MemoryStore store(50ms);
  EXPECT_THROW(store.wait({"never"}, 20ms), TimeoutError);
  EXPECT_THROW(store.get("never"), TimeoutError);
  EXPECT_FALSE(store.check({"never"}));
}

TEST(MemoryStore, AppendMultiGetMultiSet) {
  MemoryStore store;
  store.append("l", "ab");
  store.append("l", "cd");
  store.multiSet({"x", "y"}, {"1", "2"});
  EXPECT_EQ(store.multiGet({"l", "x", "y"}), (std::vector<std::string>{"abcd", "1", "2"}));
  EXPECT_THROW(store.multiSet({"x"}, {}), Error);
}

}  // namespace
}  // namespace dlrun::rendezvous
