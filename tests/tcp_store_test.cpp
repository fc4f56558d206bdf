// The C++ client against the server: every op, timeouts that leave the client usable, and many
// threads hammering one server with exact final counts.
#include "store/tcp_store.h"

#include <gtest/gtest.h>

#include <thread>

#include "common/error.h"
#include "store/prefix_store.h"
#include "store/store_server.h"
#include "tests/store_test_util.h"

namespace dlrun::rendezvous {
namespace {

using namespace std::chrono_literals;

class TcpStoreTest : public ::testing::Test {
 protected:
  TcpStoreOptions options(std::chrono::milliseconds timeout = 10s) {
    return {.at = {"127.0.0.1", server.port()}, .timeout = timeout};
  }
  StoreServerThread server{StoreServerOptions{.listen = {"127.0.0.1", 0}}};
};

TEST_F(TcpStoreTest, EveryOperation) {
  TcpStore store(options());
  store.set("k", std::string("\0bin", 4));
  EXPECT_EQ(store.get("k"), std::string("\0bin", 4));
  EXPECT_EQ(store.add("n", 10), 10);
  EXPECT_EQ(store.add("n", -3), 7);
  EXPECT_EQ(store.compareSet("k", std::string("\0bin", 4), "v2"), "v2");
  EXPECT_EQ(store.compareSet("absent", "x", "y"), "x");
  EXPECT_TRUE(store.check({"k", "n"}));
  EXPECT_FALSE(store.check({"k", "absent"}));
  store.append("l", "ab");
  store.append("l", "cd");
  store.multiSet({"m1", "m2"}, {"1", "2"});
  EXPECT_EQ(store.multiGet({"l", "m1", "m2"}), (std::vector<std::string>{"abcd", "1", "2"}));
  EXPECT_EQ(store.peek({"m2", "absent"}), (std::vector<std::string>{"2", ""}));  // no wait
  EXPECT_EQ(store.numKeys(), 5);
  EXPECT_TRUE(store.deleteKey("l"));
  EXPECT_FALSE(store.deleteKey("l"));
  store.ping();
  store.queuePush("q", "a");
  store.queuePush("q", "b");
  EXPECT_EQ(store.queueLen("q"), 2);
  EXPECT_EQ(store.queuePop("q", false), "a");
  EXPECT_EQ(store.queuePop("q", true), "b");
  EXPECT_EQ(store.queuePop("q", false), std::nullopt);
}

TEST_F(TcpStoreTest, WaitCompletedByAnotherClient) {
  TcpStore waiter(options()), setter(options());
  std::thread t([&] { setter.set("go", "1"); });
  waiter.wait({"go"}, 10s);
  t.join();
  EXPECT_EQ(waiter.get("go"), "1");
}

TEST_F(TcpStoreTest, TimedOutWaitLeavesTheClientUsable) {
  TcpStore store(options(200ms));
  EXPECT_THROW(store.wait({"never"}, 100ms), TimeoutError);
  EXPECT_THROW(store.get("never"), TimeoutError);
  store.set("never", "now");  // the cancelled waits must not answer later requests
  EXPECT_EQ(store.add("n", 1), 1);
  EXPECT_EQ(store.get("never"), "now");
}

TEST_F(TcpStoreTest, ConnectGivesUpAtItsDeadline) {
  uint16_t closedPort;
  {
    StoreServerThread gone({.listen = {"127.0.0.1", 0}});
    closedPort = gone.port();
  }
  TcpStoreOptions refused{.at = {"127.0.0.1", closedPort}, .connectTimeout = 300ms};
  const auto start = Clock::now();
  EXPECT_THROW(TcpStore{refused}, ConnectionRefused);  // nothing listens: told apart from a
  EXPECT_LT(Clock::now() - start, 5s);                 // network that does not answer
}

TEST_F(TcpStoreTest, SixtyFourThreadsThousandOpsEachGiveExactCounts) {
  constexpr int kThreads = 64, kOps = 1000;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      try {
        TcpStore store(options());
        for (int i = 0; i < kOps; ++i) {
          switch (i % 4) {
            case 0: store.add("counter", 1); break;
            case 1: store.set("t" + std::to_string(t) + "/" + std::to_string(i), "x"); break;
            case 2: store.append("log", "."); break;
            case 3: store.compareSet("cas", "", "first"); break;
          }
        }
      } catch (const std::exception& e) {
        ++failures;
        ADD_FAILURE() << e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(failures, 0);
  TcpStore check(options());
  EXPECT_EQ(check.get("counter"), std::to_string(kThreads * kOps / 4));
  EXPECT_EQ(check.get("log").size(), static_cast<size_t>(kThreads * kOps / 4));
  EXPECT_EQ(check.get("cas"), "first");
  EXPECT_EQ(check.numKeys(), kThreads * kOps / 4 + 3);
}

TEST_F(TcpStoreTest, ThroughAPrefixStore) {
  auto tcp = std::make_shared<TcpStore>(options());
  PrefixStore job("job7", tcp);
  job.set("k", "v");
  EXPECT_EQ(tcp->get("job7/k"), "v");
  EXPECT_EQ(job.add("n", 2), 2);
}

TEST_F(TcpStoreTest, ALeaseFiresItsTripwiresWhenItsHolderGoes) {
  TcpStore observer(options());
  {
    TcpStoreOptions holding = options();
    holding.reconnect = false;
    TcpStore holder(holding);
    holder.lease("node/0", "record", 10min, {{"round/1/restart", "node/0"}, {"dead", "0"}});
    EXPECT_EQ(observer.get("node/0"), "record");
    EXPECT_FALSE(observer.waitFor({"round/1/restart"}, 100ms));
  }
  EXPECT_TRUE(observer.waitFor({"round/1/restart", "dead"}, 10s));
  EXPECT_EQ(observer.get("round/1/restart"), "node/0");
  EXPECT_FALSE(observer.check({"node/0"}));
}

TEST_F(TcpStoreTest, ALeaseNeedsAPositiveTtl) {
  TcpStore store(options());
  EXPECT_THROW(store.lease("k", "v", 0ms, {}), Error);
  EXPECT_FALSE(store.check({"k"}));
}

TEST_F(TcpStoreTest, WaitForAnswersFalseOnTimeoutAndStaysInStep) {
  TcpStore store(options(200ms));
  EXPECT_FALSE(store.waitFor({"never"}, 100ms));
  store.set("now", "1");
  EXPECT_TRUE(store.waitFor({"now"}, 100ms));
  EXPECT_EQ(store.add("n", 1), 1);
}

TEST_F(TcpStoreTest, WithoutReconnectAFailedConnectionStaysLost) {
  StoreServerThread strict({.listen = {"127.0.0.1", 0}, .limits = {.maxKeyBytes = 8}});
  TcpStore store({.at = {"127.0.0.1", strict.port()}, .reconnect = false});
  EXPECT_THROW(store.add("a key over the limit", 1), NetworkError);  // the server hangs up
  for (int i = 0; i < 2; ++i) {
    try {
      store.ping();
      ADD_FAILURE() << "a call after the connection failed succeeded";
    } catch (const NetworkError& e) {
      EXPECT_EQ(std::string(e.what()),
                "lost the connection to the store at 127.0.0.1:" + std::to_string(strict.port()));
    }
  }
}

TEST_F(TcpStoreTest, AbortEndsACallBlockedInAnotherThread) {
  TcpStoreOptions holding = options();
  holding.reconnect = false;
  TcpStore store(holding);
  std::atomic<bool> calling{false};
  std::atomic<bool> threw{false};
  std::thread blocked([&] {
    calling = true;
    try {
      store.waitFor({"never"}, 10min);
    } catch (const NetworkError&) {
      threw = true;
    }
  });
  ASSERT_TRUE(testing::eventually([&] { return calling.load(); }));
  // Makes it likely that the call is already blocked; the outcome is the same either way.
  std::this_thread::sleep_for(50ms);
  const auto start = Clock::now();
  store.abort();
  blocked.join();
  EXPECT_TRUE(threw);
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_THROW(store.ping(), NetworkError);
}

TEST_F(TcpStoreTest, AfterAbortTheNextCallReconnects) {
  TcpStore store(options());
  store.set("k", "v");
  store.abort();
  EXPECT_EQ(store.get("k"), "v");
  store.ping();
}

}  // namespace
}  // namespace dlrun::rendezvous
