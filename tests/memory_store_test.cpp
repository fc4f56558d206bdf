#include "store/memory_store.h"

#include <gtest/gtest.h>

#include <future>
#include <stdexcept>
#include <thread>

#include "common/error.h"
#include "store/store_engine.h"

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

TEST(MemoryStore, RefusesWithTheEnginesOwnWords) {
  // dlrund closes a connection with the engine's refusal; the in-memory store throws the same
  // text, because it is the same engine.
  struct Sink : Peer {
    void send(std::string_view) override {}
  } peer;
  StoreEngine engine;
  wire::Request set;
  set.op = wire::Op::Set;
  set.keys = {"s"};
  set.values = {"abc"};
  ASSERT_NO_THROW(engine.handle(peer, set, {}));
  wire::Request add;
  add.op = wire::Op::Add;
  add.keys = {"s"};
  add.number = 1;
  std::string refusal;
  try {
    engine.handle(peer, add, {});
  } catch (const RequestError& e) {
    refusal = e.what();
  }
  ASSERT_NE(refusal, "");

  MemoryStore store;
  store.set("s", "abc");
  try {
    store.add("s", 1);
    FAIL() << "ADD on a non-integer was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.what(), refusal);
  }
  EXPECT_EQ(store.get("s"), "abc");  // unchanged, and the client still works
}

TEST(MemoryStore, ThreadsSharingAClientWaitAtOnce) {
  MemoryStore store;
  auto first = std::async(std::launch::async, [&] { return store.waitFor({"a"}, 10s); });
  auto second = std::async(std::launch::async, [&] { return store.waitFor({"b"}, 10s); });
  store.set("b", "1");
  EXPECT_TRUE(second.get());
  store.set("a", "1");
  EXPECT_TRUE(first.get());
}

TEST(MemoryStore, OnRealTimeALeaseLapsesWithoutAnyRequest) {
  auto server = std::make_shared<MemoryStoreServer>();
  MemoryStore holder(server), observer(server);
  holder.lease("held", "v", 20ms, {{"trip", "lapsed"}});
  EXPECT_TRUE(observer.waitFor({"trip"}, 10s));  // the waiter fires the lease at its deadline
  EXPECT_EQ(observer.peek({"held", "trip"}), (std::vector<std::string>{"", "lapsed"}));
}

// Virtual time: one thread takes part and waits; time jumps to each deadline in turn.
class VirtualTime : public ::testing::Test {
 protected:
  template <typename Fn>
  auto alone(Fn fn) {
    server->addParticipants(1);
    return std::async(std::launch::async,
                      [this, fn] {
                        auto result = fn();
                        server->removeParticipant();
                        return result;
                      })
        .get();
  }

  std::shared_ptr<MemoryStoreServer> server =
      std::make_shared<MemoryStoreServer>(MemoryStoreServer::Time::Virtual);
};

TEST_F(VirtualTime, AWaitTimesOutAtItsDeadlineAtOnce) {
  MemoryStore store(server);
  const auto start = server->now();
  EXPECT_FALSE(alone([&] { return store.waitFor({"never"}, 1h); }));
  EXPECT_EQ(server->now() - start, 1h);
  EXPECT_TRUE(alone([&] {  // the connection stays usable after the cancelled wait
    store.set("now", "1");
    return store.waitFor({"now"}, 1h);
  }));
  EXPECT_EQ(server->now() - start, 1h);
}

TEST_F(VirtualTime, ASilentHoldersLeaseLapsesOneTtlAfterItsLastRequest) {
  MemoryStore holder(server), observer(server);
  holder.lease("held", "v", 3s, {{"trip", "lapsed"}});
  const auto start = server->now();
  EXPECT_TRUE(alone([&] { return observer.waitFor({"trip"}, 1h); }));
  EXPECT_EQ(server->now() - start, 3s);
  EXPECT_FALSE(observer.check({"held"}));
}

TEST_F(VirtualTime, WaitingRenewsTheWaitersOwnLease) {
  MemoryStore holder(server);
  holder.lease("held", "v", 3s, {{"trip", "lapsed"}});
  // Ten one-second waits: each renews the lease, so it never lapses.
  EXPECT_TRUE(alone([&] {
    for (int i = 0; i < 10; ++i)
      if (holder.waitFor({"trip"}, 1s)) return false;
    return true;
  }));
  EXPECT_TRUE(holder.check({"held"}));
}

TEST_F(VirtualTime, AbortFiresTheLeasesAndEndsTheBlockedWait) {
  MemoryStore holder(server), observer(server);
  holder.lease("held", "v", 1h, {{"trip", "killed"}});
  server->addParticipants(2);
  auto blocked = std::async(std::launch::async, [&] {
    bool threw = false;
    try {
      holder.waitFor({"never"}, 2h);
    } catch (const NetworkError&) {
      threw = true;
    }
    server->removeParticipant();
    return threw;
  });
  auto killer = std::async(std::launch::async, [&] {
    holder.abort();
    const bool tripped = observer.waitFor({"trip"}, 1s);
    server->removeParticipant();
    return tripped;
  });
  EXPECT_TRUE(blocked.get());
  EXPECT_TRUE(killer.get());
  EXPECT_EQ(server->now(), Clock::time_point{});  // no time passed: the kill was immediate
  EXPECT_THROW(holder.set("k", "v"), NetworkError);
}

TEST_F(VirtualTime, AWaitByAThreadThatTakesNoPartIsRefused) {
  MemoryStore store(server);
  EXPECT_THROW(store.waitFor({"never"}, 1s), std::logic_error);
  store.set("never", "1");  // the refused wait left nothing behind
  EXPECT_TRUE(store.waitFor({"never"}, 1s));
}

}  // namespace
}  // namespace dlrun::rendezvous
