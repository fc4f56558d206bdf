// Fail-over on a real 3-member etcd cluster (tests/etcd_cluster.h): a member SIGKILLed under a
// client, its keep-alive, its watch (also one resumed past a compaction) and an EtcdStore's
// lease. Each test forms its own cluster (a killed member is gone for good) and kills the member
// its streams use; where that member is the leader, the survivors elect another (1 to 2 s on
// etcd's default settings) meanwhile. The times the moves took are printed.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <future>
#include <set>
#include <thread>

#include "common/clock.h"
#include "common/error.h"
#include "rendezvous/etcd/etcd_client.h"
#include "rendezvous/etcd/etcd_keep_alive.h"
#include "rendezvous/etcd/etcd_store.h"
#include "rendezvous/etcd/etcd_watch.h"
#include "tests/etcd_cluster.h"

namespace dlrun::rendezvous::etcd {
namespace {

using namespace std::chrono_literals;

// Follower kills move within about a second; a leader kill also waits for the election.
constexpr auto kFollowerFailover = 1500ms;
constexpr auto kLeaderFailover = 4s;

EtcdClientOptions clientOptions(std::vector<Endpoint> endpoints) {
  return {.endpoints = std::move(endpoints), .timeout = 5s, .connectTimeout = 5s};
}

class EtcdFailover : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      cluster_.start();
    } catch (const std::exception& error) {
      FAIL() << "cannot start the etcd cluster: " << error.what();
    }
    const auto leader = cluster_.leader();
    ASSERT_TRUE(leader) << "no leader elected";
    leader_ = *leader;
  }

  size_t follower() const { return (leader_ + 1) % test::EtcdCluster::kMembers; }
  size_t memberOf(const std::string& endpoint) const {
    const auto member = cluster_.memberAt(endpoint);
    EXPECT_TRUE(member) << endpoint;
    return member.value_or(0);
  }

  // A CAS the way a caller makes one across a fail-over: a write that failed may have applied,
  // so it re-reads and decides again instead of retrying blindly.
  static void casIncrement(EtcdClient& client, const std::string& key) {
    auto current = client.get(key);
    while (true) {
      const std::string desired = std::to_string(std::stoll(current->value) + 1);
      try {
        const auto result = client.putIfRevision(key, current->modRevision, desired);
        if (result.swapped) return;
        current = result.current;
      } catch (const NetworkError&) {
        current = client.get(key);  // re-read: the next round decides on what is there
      }
    }
  }

  // SIGKILLs a member under a client, then times its next read and CAS.
  void readAndSwapAfterKill(size_t victim, std::chrono::milliseconds bound) {
    EtcdClient client(clientOptions(cluster_.endpointsFrom(victim)));
    ASSERT_EQ(client.endpoint(), cluster_.endpoint(victim).text());
    client.put("counter", "0");
    casIncrement(client, "counter");

    const auto killed = Clock::now();
    cluster_.kill(victim);
    const auto read = client.get("counter");
    ASSERT_TRUE(read);
    EXPECT_EQ(read->value, "1");
    casIncrement(client, "counter");
    const auto took = Clock::now() - killed;
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(took).count();
    EXPECT_LT(took, bound) << ms << " ms";
    std::printf("client: read and swapped on another member %lld ms after the kill\n",
                static_cast<long long>(ms));
    EXPECT_NE(client.endpoint(), cluster_.endpoint(victim).text());
    EXPECT_EQ(client.get("counter")->value, "2");  // applied once, not twice
  }

  test::EtcdCluster cluster_;
  size_t leader_ = 0;
};

TEST_F(EtcdFailover, ReadsAndSwapsMoveToAnotherMemberWhenAFollowerDies) {
  readAndSwapAfterKill(follower(), kFollowerFailover);
}

TEST_F(EtcdFailover, ReadsAndSwapsMoveToAnotherMemberWhenTheLeaderDies) {
  readAndSwapAfterKill(leader_, kLeaderFailover);
}

TEST_F(EtcdFailover, ALeaseKeptAliveAcrossTheKillOfItsStreamsMemberDoesNotLapse) {
  EtcdClient client(clientOptions(cluster_.endpointsFrom(leader_)));
  const int64_t lease = client.leaseGrant(2s);
  client.put("held", "1", lease);
  auto keepAlive = client.keepAlive(lease, 666ms);
  const auto deadline = Clock::now() + 2s;
  while (keepAlive->renewals() == 0 && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
  ASSERT_GT(keepAlive->renewals(), 0);
  const size_t victim = memberOf(keepAlive->endpoint());

  const auto killed = Clock::now();
  cluster_.kill(victim);
  // The first renewal after the kill (reaped: it answers nothing more) is on another member,
  // after an election: it was the leader.
  const auto renewed = keepAlive->renewals();
  while (keepAlive->renewals() <= renewed && Clock::now() < killed + 6s) {
    std::this_thread::sleep_for(10ms);
  }
  const auto moved = Clock::now() - killed;
  // How soon is the election's (etcd's timeouts, the machine's load): what must hold is that a
  // renewal came at all and the lease outlived the kill (below).
  ASSERT_GT(keepAlive->renewals(), renewed) << "no renewal within 6 s of the kill";
  std::printf(
      "keep-alive: renewed on another member %lld ms after the kill\n",
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(moved).count()));
  // Three TTLs from the kill: a lease that missed its renewals would have lapsed twice over.
  std::this_thread::sleep_until(killed + 6s);
  EXPECT_TRUE(keepAlive->alive()) << keepAlive->failure();
  EXPECT_GE(keepAlive->renewals(), renewed + 3);
  EXPECT_NE(keepAlive->endpoint(), cluster_.endpoint(victim).text());
  const auto held = client.get("held");
  ASSERT_TRUE(held) << "the lease lapsed";
  EXPECT_EQ(held->lease, lease);
}

TEST_F(EtcdFailover, AWatchSeesEveryEventOnceInOrderAcrossAMemberKill) {
  EtcdClient watcher(clientOptions(cluster_.endpointsFrom(leader_)));
  // Events written before the watch starts are not its business: it starts from now.
  watcher.put("events/before", "x");
  auto watch = watcher.watchPrefix("events/", 0);
  const size_t victim = memberOf(watch->endpoint());

  // The writer sits on a member that survives; during the election its writes stall or fail,
  // and it re-reads instead of writing twice.
  constexpr int kEvents = 60;
  auto writer = std::async(std::launch::async, [&] {
    // A short deadline: a follower drops a proposal made while it has no leader, and the
    // write then hangs until the deadline; the writer re-reads and writes again.
    auto options = clientOptions(cluster_.endpointsFrom((victim + 1) % 3));
    options.timeout = 1s;
    EtcdClient client(options);
    const auto giveUp = Clock::now() + 20s;
    for (int i = 0; i < kEvents; ++i) {
      char key[32];
      std::snprintf(key, sizeof key, "events/%03d", i);
      while (true) {
        try {
          client.putIfAbsent(key, std::to_string(i));
          break;
        } catch (const Error&) {
          if (Clock::now() > giveUp) throw;
        }
        // It may have applied before the failure. Without a leader the read fails as well.
        try {
          if (client.get(key)) break;
        } catch (const Error&) {
        }
      }
      std::this_thread::sleep_for(15ms);
    }
  });

  std::vector<WatchEvent> seen;
  bool killed = false;
  Clock::time_point killedAt, movedAt;
  const auto deadline = Clock::now() + 20s;
  while (static_cast<int>(seen.size()) < kEvents && Clock::now() < deadline) {
    for (auto& event : watch->next(200ms)) seen.push_back(std::move(event));
    if (killed && movedAt == Clock::time_point() && watch->reconnects() > 0) movedAt = Clock::now();
    if (!killed && seen.size() >= kEvents / 3) {
      cluster_.kill(victim);  // events are written before, during and after
      killed = true;
      killedAt = Clock::now();
    }
  }
  writer.get();
  ASSERT_TRUE(killed);
  // Nothing more comes: no event twice.
  for (auto& event : watch->next(300ms)) seen.push_back(std::move(event));
  ASSERT_EQ(seen.size(), static_cast<size_t>(kEvents));
  for (int i = 0; i < kEvents; ++i) {
    char key[32];
    std::snprintf(key, sizeof key, "events/%03d", i);
    EXPECT_EQ(seen[i].kv.key, key);
    EXPECT_EQ(seen[i].type, WatchEvent::Type::Put);
    if (i > 0) {
      EXPECT_GT(seen[i].kv.modRevision, seen[i - 1].kv.modRevision);
    }
  }
  EXPECT_GE(watch->reconnects(), 1);
  EXPECT_LT(movedAt - killedAt, kLeaderFailover);
  std::printf(
      "watch: moved to another member %lld ms after the kill\n",
      static_cast<long long>(
          std::chrono::duration_cast<std::chrono::milliseconds>(movedAt - killedAt).count()));
  EXPECT_NE(watch->endpoint(), cluster_.endpoint(victim).text());
  EXPECT_EQ(watch->lastRevision(), seen.back().kv.modRevision);
}

TEST_F(EtcdFailover, AWatchResumedPastACompactionSaysSoInsteadOfSkipping) {
  const size_t victim = follower();
  EtcdClient writer(clientOptions(cluster_.endpointsFrom(leader_)));
  EtcdClient watcher(clientOptions(cluster_.endpointsFrom(victim)));
  auto watch = watcher.watchPrefix("gap/", 0);
  ASSERT_EQ(memberOf(watch->endpoint()), victim);
  const int64_t resumeFrom = watch->lastRevision() + 1;
  // The watch's member dies unnoticed (nobody calls next()); meanwhile the events it missed
  // are written and compacted away.
  cluster_.kill(victim);
  int64_t last = 0;
  for (int i = 0; i < 3; ++i) last = writer.put("gap/" + std::to_string(i), "x");
  ASSERT_TRUE(cluster_.compact(last));
  try {
    const auto events = watch->next(5s);
    FAIL() << "resumed past a compaction with " << events.size() << " events";
  } catch (const NetworkError& error) {
    FAIL() << "not a compaction: " << error.what();
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("compacted up to revision " + std::to_string(last)), std::string::npos)
        << message;
    EXPECT_NE(message.find("resumes from " + std::to_string(resumeFrom)), std::string::npos)
        << message;
  }
}

TEST_F(EtcdFailover, AStoreLeaseHeldAcrossAMemberKillFiresNoTripwire) {
  auto options = [&](size_t first) {
    return EtcdStoreOptions{.client = clientOptions(cluster_.endpointsFrom(first)),
                            .prefix = "failover/",
                            .timeout = 5s};
  };
  // The holder and the watcher both on the leader: its kill moves the keep-alive and the watch.
  EtcdStore holder(options(leader_));
  EtcdStore watcher(options(leader_));
  holder.lease("node", "record", 2s, {{"lost", "node"}});
  EXPECT_FALSE(watcher.waitFor({"lost"}, 100ms));  // opens the watcher's watch
  const size_t victim = memberOf(watcher.client().endpoint());

  cluster_.kill(victim);
  // Three TTLs: a lapse would have fired the tripwire through the watcher.
  EXPECT_FALSE(watcher.waitFor({"lost"}, 6s));
  EXPECT_TRUE(watcher.check({"node"}));
  EXPECT_EQ(watcher.get("node"), "record");
  EXPECT_FALSE(holder.check({"lost"}));
}

}  // namespace
}  // namespace dlrun::rendezvous::etcd
