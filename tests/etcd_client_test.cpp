// EtcdClient against a real etcd (tests/etcd_server.h starts Debian's /usr/bin/etcd on
// loopback, one per test program): reads and writes with revisions, compare-and-swap both ways,
// add under concurrency, leases kept alive past their TTL and let lapse, watches from a
// revision, and endpoints that do not answer. Each test uses keys of its own.
#include "rendezvous/etcd/etcd_client.h"

#include <gtest/gtest.h>
#include <algorithm>

#include <thread>

#include "common/clock.h"
#include "common/error.h"
#include "etcd/rpc.pb.h"
#include "rendezvous/etcd/etcd_keep_alive.h"
#include "rendezvous/etcd/etcd_watch.h"
#include "tests/etcd_server.h"

namespace dlrun::rendezvous::etcd {
namespace {

using namespace std::chrono_literals;

[[maybe_unused]] auto* const environment =
    ::testing::AddGlobalTestEnvironment(new test::EtcdEnvironment);

class EtcdClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server = test::sharedEtcd();
    ASSERT_NE(server, nullptr) << "etcd is not running";
    // A clean slate, also when the test runs again (--gtest_repeat) against the same etcd.
    EtcdClient(options()).deleteRange(key(""), EtcdClient::prefixEnd(key("")));
  }
  EtcdClientOptions options() const {
    return {.endpoints = server->endpoints(), .timeout = 5s, .connectTimeout = 5s};
  }
  test::EtcdServer* server = nullptr;
  // Keys of this test only.
  std::string key(const std::string& name) const {
    return std::string("test/") + ::testing::UnitTest::GetInstance()->current_test_info()->name() +
           "/" + name;
  }
  // Waits for the next events, failing the test after `timeout`.
  static std::vector<WatchEvent> nextEvents(EtcdWatch& watch, std::chrono::milliseconds timeout) {
    auto events = watch.next(timeout);
    EXPECT_FALSE(events.empty()) << "no event within " << timeout.count() << " ms";
    return events;
  }
};

TEST_F(EtcdClientTest, PutGetDelete) {
  EtcdClient client(options());
  EXPECT_EQ(client.endpoint(), server->endpoints().front().text());
  const std::string binary("v\0\xff", 3);
  const int64_t first = client.put(key("a"), binary);
  const int64_t second = client.put(key("b"), "2");
  EXPECT_GT(second, first);
  const auto a = client.get(key("a"));
  ASSERT_TRUE(a);
  EXPECT_EQ(a->value, binary);
  EXPECT_EQ(a->createRevision, first);
  EXPECT_EQ(a->modRevision, first);
  EXPECT_EQ(a->version, 1);
  EXPECT_EQ(client.put(key("a"), "again"), second + 1);
  EXPECT_EQ(client.get(key("a"))->version, 2);

  const auto all = client.rangePrefix(key(""));
  ASSERT_EQ(all.kvs.size(), 2u);
  EXPECT_EQ(all.kvs[0].value, "again");
  EXPECT_EQ(all.kvs[1].value, "2");
  EXPECT_GE(all.revision, second + 1);
  EXPECT_EQ(client.range(key("a"), {}, first).kvs.at(0).value, binary);  // an older revision

  EXPECT_TRUE(client.deleteKey(key("a")));
  EXPECT_FALSE(client.deleteKey(key("a")));
  EXPECT_FALSE(client.get(key("a")));
  EXPECT_EQ(client.deleteRange(key(""), EtcdClient::prefixEnd(key(""))), 1);
  EXPECT_TRUE(client.rangePrefix(key("")).kvs.empty());
}

TEST_F(EtcdClientTest, PrefixEnd) {
  EXPECT_EQ(EtcdClient::prefixEnd("ab"), "ac");
  EXPECT_EQ(EtcdClient::prefixEnd("a\xff"), "b");
  EXPECT_EQ(EtcdClient::prefixEnd("\xff\xff"), std::string(1, '\0'));
}

TEST_F(EtcdClientTest, CompareAndSwapBothWays) {
  EtcdClient client(options());
  auto created = client.putIfAbsent(key("k"), "one");
  EXPECT_TRUE(created.swapped);
  auto again = client.putIfAbsent(key("k"), "other");
  EXPECT_FALSE(again.swapped);
  ASSERT_TRUE(again.current);
  EXPECT_EQ(again.current->value, "one");  // read in the same transaction
  EXPECT_EQ(again.current->modRevision, created.revision);

  auto wrongValue = client.putIfValue(key("k"), "nope", "two");
  EXPECT_FALSE(wrongValue.swapped);
  EXPECT_EQ(wrongValue.current->value, "one");
  auto rightValue = client.putIfValue(key("k"), "one", "two");
  EXPECT_TRUE(rightValue.swapped);
  EXPECT_EQ(client.get(key("k"))->value, "two");
  // A missing key never equals a value, not even the empty one.
  auto missing = client.putIfValue(key("missing"), "", "x");
  EXPECT_FALSE(missing.swapped);
  EXPECT_FALSE(missing.current);

  auto stale = client.putIfRevision(key("k"), created.revision, "three");
  EXPECT_FALSE(stale.swapped);
  EXPECT_EQ(stale.current->value, "two");
  auto fresh = client.putIfRevision(key("k"), stale.current->modRevision, "three");
  EXPECT_TRUE(fresh.swapped);
  EXPECT_EQ(client.get(key("k"))->value, "three");
  EXPECT_TRUE(client.putIfRevision(key("new"), 0, "made").swapped);  // 0: missing
  EXPECT_FALSE(client.putIfRevision(key("new"), 0, "again").swapped);
}

TEST_F(EtcdClientTest, AddUnderConcurrencyCountsExactly) {
  constexpr int kThreads = 8, kAdds = 50;
  EtcdClient shared(options()), other(options());
  std::vector<std::thread> threads;
  std::vector<std::vector<int64_t>> results(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      EtcdClient& client = t % 2 ? shared : other;  // threads of one client and of two
      for (int i = 0; i < kAdds; ++i) results[t].push_back(client.add(key("n"), 1));
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(shared.get(key("n"))->value, std::to_string(kThreads * kAdds));
  // Each add saw its own result: 1..400 once each.
  std::vector<int64_t> all;
  for (const auto& mine : results) all.insert(all.end(), mine.begin(), mine.end());
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], static_cast<int64_t>(i) + 1);
  EXPECT_EQ(shared.add(key("n"), -400), 0);
  EXPECT_EQ(shared.add(key("fresh"), 5), 5);
  shared.put(key("spelled"), "007");  // an integer spelled otherwise than add() spells it
  EXPECT_EQ(shared.add(key("spelled"), 1), 8);
  shared.put(key("text"), "abc");
  EXPECT_THROW(shared.add(key("text"), 1), Error);
}

TEST_F(EtcdClientTest, AMarkedAddSaysWhetherItApplied) {
  EtcdClient client(options());
  const EtcdClient::AddMark mark{key("mark"), "7"};
  EXPECT_FALSE(client.addApplied(mark));  // not tried yet
  EXPECT_EQ(client.add(key("n"), 2, mark), 2);
  EXPECT_EQ(client.addApplied(mark), 2);
  EXPECT_EQ(client.add(key("n"), 3), 5);  // an unmarked add leaves the mark alone
  EXPECT_EQ(client.addApplied(mark), 2);
  EXPECT_FALSE(client.addApplied({key("mark"), "8"}));  // another add's token
}

TEST_F(EtcdClientTest, RawTxnWritesSeveralKeysAtOneRevision) {
  EtcdClient client(options());
  etcdserverpb::TxnRequest request;
  for (const char* name : {"x", "y"}) {
    auto* put = request.add_success()->mutable_request_put();
    put->set_key(key(name));
    put->set_value(name);
  }
  const auto response = client.txn(request);
  EXPECT_TRUE(response.succeeded());
  EXPECT_EQ(client.get(key("x"))->modRevision, client.get(key("y"))->modRevision);
}

TEST_F(EtcdClientTest, KeepAliveHoldsAKeyPastItsTtlAndAStoppedOneLetsItLapse) {
  EtcdClient client(options());
  const int64_t lease = client.leaseGrant(2s);
  const int64_t revision = client.put(key("held"), "alive", lease);
  EXPECT_EQ(client.get(key("held"))->lease, lease);
  auto watch = client.watch(key("held"), {}, revision + 1);
  auto keepAlive = client.keepAlive(lease, 500ms);

  // Twice the TTL with renewals: nothing happens to the key.
  EXPECT_TRUE(watch->next(4s).empty());
  EXPECT_TRUE(client.get(key("held")));
  EXPECT_TRUE(keepAlive->alive()) << keepAlive->failure();
  EXPECT_GE(keepAlive->renewals(), 4);

  // Without renewals the lease lapses within its TTL (plus etcd's 0.5 s expiry sweep) and
  // etcd deletes the key.
  keepAlive->stop();
  EXPECT_FALSE(keepAlive->alive());
  const auto stopped = Clock::now();
  const auto events = nextEvents(*watch, 5s);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].type, WatchEvent::Type::Delete);
  EXPECT_EQ(events[0].kv.key, key("held"));
  EXPECT_LT(Clock::now() - stopped, 4s);
  EXPECT_FALSE(client.get(key("held")));
  EXPECT_TRUE(keepAlive->failure().empty());  // a stop is no failure
}

TEST_F(EtcdClientTest, RevokedLeaseDeletesItsKeysAndEndsTheKeepAlive) {
  EtcdClient client(options());
  const int64_t lease = client.leaseGrant(10s);
  client.put(key("a"), "1", lease);
  client.put(key("b"), "2", lease);
  auto keepAlive = client.keepAlive(lease, 200ms);
  client.leaseRevoke(lease);
  EXPECT_TRUE(client.rangePrefix(key("")).kvs.empty());
  // The next renewal hears that the lease is gone.
  const auto deadline = Clock::now() + 3s;
  while (keepAlive->alive() && Clock::now() < deadline) std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(keepAlive->alive());
  EXPECT_NE(keepAlive->failure().find("lease is gone"), std::string::npos) << keepAlive->failure();
  EXPECT_THROW(client.put(key("c"), "3", lease), Error);  // etcd: lease not found
}

TEST_F(EtcdClientTest, WatchFromARevisionSeesEveryEventOnceInOrder) {
  EtcdClient client(options());
  // History before the watch exists...
  const int64_t start = client.put(key("a"), "1");
  client.put(key("b"), "2");
  client.deleteKey(key("a"));
  client.put(key("b"), "3");
  client.put("test/elsewhere", "not watched");
  auto watch = client.watchPrefix(key(""), start);
  // ...and after it.
  client.put(key("c"), "4");
  client.deleteKey(key("b"));

  const std::vector<std::pair<WatchEvent::Type, std::string>> expected = {
      {WatchEvent::Type::Put, "a"}, {WatchEvent::Type::Put, "b"}, {WatchEvent::Type::Delete, "a"},
      {WatchEvent::Type::Put, "b"}, {WatchEvent::Type::Put, "c"}, {WatchEvent::Type::Delete, "b"}};
  std::vector<WatchEvent> seen;
  const auto deadline = Clock::now() + 5s;
  while (seen.size() < expected.size() && Clock::now() < deadline) {
    for (auto& event : watch->next(1s)) seen.push_back(std::move(event));
  }
  ASSERT_EQ(seen.size(), expected.size());
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].type, expected[i].first) << i;
    EXPECT_EQ(seen[i].kv.key, key(expected[i].second)) << i;
    if (i > 0) {
      EXPECT_GT(seen[i].kv.modRevision, seen[i - 1].kv.modRevision) << i;
    }
  }
  EXPECT_EQ(seen[3].kv.value, "3");
  EXPECT_TRUE(watch->next(300ms).empty());  // nothing twice
  EXPECT_EQ(watch->lastRevision(), seen.back().kv.modRevision);

  // A watch resumed after the last revision seen repeats nothing and misses nothing.
  auto resumed = client.watchPrefix(key(""), watch->lastRevision() + 1);
  client.put(key("d"), "5");
  const auto events = nextEvents(*resumed, 5s);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kv.key, key("d"));
}

TEST_F(EtcdClientTest, AWatchOfSeveralRangesKeepsEachRangesFilterAndRevisions) {
  EtcdClient client(options());
  const int64_t start = client.put(key("wait/a"), "1");  // history from here...
  client.put(key("other"), "x");
  client.deleteKey(key("other"));
  // Deletes anywhere under the prefix; puts of wait/ only (from an older revision: history).
  auto watch = client.watch({{.key = key(""),
                              .rangeEnd = EtcdClient::prefixEnd(key("")),
                              .only = WatchRange::Only::Deletes,
                              .startRevision = start + 1},
                             {.key = key("wait/"),
                              .rangeEnd = EtcdClient::prefixEnd(key("wait/")),
                              .only = WatchRange::Only::Puts,
                              .startRevision = start}});
  client.put(key("other"), "y");  // ...and after: neither range takes this put
  client.deleteKey(key("wait/a"));
  client.put(key("wait/b"), "2");

  std::vector<std::pair<WatchEvent::Type, std::string>> seen;
  const auto deadline = Clock::now() + 5s;
  while (seen.size() < 4 && Clock::now() < deadline) {
    for (auto& event : watch->next(1s)) seen.emplace_back(event.type, event.kv.key);
  }
  std::sort(seen.begin(), seen.end());  // the ranges interleave in no promised order
  const std::vector<std::pair<WatchEvent::Type, std::string>> expected = {
      {WatchEvent::Type::Put, key("wait/a")},
      {WatchEvent::Type::Put, key("wait/b")},
      {WatchEvent::Type::Delete, key("other")},
      {WatchEvent::Type::Delete, key("wait/a")}};
  EXPECT_EQ(seen, expected);
  EXPECT_TRUE(watch->next(300ms).empty());  // nothing twice
  EXPECT_EQ(watch->lastRevision(1), client.get(key("wait/b"))->modRevision);
}

TEST_F(EtcdClientTest, CancelFromAnotherThreadEndsABlockedWatch) {
  EtcdClient client(options());
  auto watch = client.watch(key("quiet"), {}, 0);
  std::thread canceller([&] {
    std::this_thread::sleep_for(200ms);
    watch->cancel();
  });
  const auto started = Clock::now();
  EXPECT_THROW(watch->next(10s), NetworkError);
  EXPECT_LT(Clock::now() - started, 5s);
  canceller.join();
}

TEST_F(EtcdClientTest, PicksTheEndpointThatAnswers) {
  const auto dead = reserveFreePorts("127.0.0.1", 1).front();  // nothing listens there
  auto endpoints = server->endpoints();
  endpoints.insert(endpoints.begin(), Endpoint{"127.0.0.1", dead});
  EtcdClient client({.endpoints = endpoints, .timeout = 5s, .connectTimeout = 5s});
  EXPECT_EQ(client.endpoint(), server->endpoints().front().text());
  client.put(key("k"), "v");
  EXPECT_EQ(client.get(key("k"))->value, "v");
}

TEST(EtcdClientFailure, AReadMovesToTheNextEndpointWhenItsOwnGoesAway) {
  // Two one-member clusters stand in for two members of one: what is tested is the client
  // moving on, not etcd's replication.
  test::EtcdServer first, second;
  first.start();
  second.start();
  auto endpoints = first.endpoints();
  endpoints.push_back(second.endpoints().front());
  EtcdClient client({.endpoints = endpoints, .timeout = 2s, .connectTimeout = 2s});
  ASSERT_EQ(client.endpoint(), first.endpoints().front().text());
  EtcdClient({.endpoints = second.endpoints()}).put("k", "on the second");
  first.stop();
  const auto started = Clock::now();
  EXPECT_EQ(client.get("k")->value, "on the second");  // retried once, on the other endpoint
  EXPECT_EQ(client.endpoint(), second.endpoints().front().text());
  EXPECT_LT(Clock::now() - started, 4s);
}

TEST(EtcdClientFailure, UnreachableEndpointsFailWithOneLineInBoundedTime) {
  const auto ports = reserveFreePorts("127.0.0.1", 2);
  const std::vector<Endpoint> endpoints = {{"127.0.0.1", ports[0]}, {"127.0.0.1", ports[1]}};
  const auto started = Clock::now();
  try {
    EtcdClient client({.endpoints = endpoints, .timeout = 1s, .connectTimeout = 1s});
    FAIL() << "connected to nothing";
  } catch (const NetworkError& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_NE(message.find(endpoints[0].text()), std::string::npos) << message;
    EXPECT_NE(message.find(endpoints[1].text()), std::string::npos) << message;
    EXPECT_NE(message.find("1 s"), std::string::npos) << message;
  }
  EXPECT_LT(Clock::now() - started, 3s);
}

TEST(EtcdClientFailure, AnEndpointThatGoesAwayFailsTheNextCallWithOneLine) {
  test::EtcdServer own;  // not the shared one: this test stops it
  own.start();
  EtcdClient client({.endpoints = own.endpoints(), .timeout = 2s, .connectTimeout = 1s});
  client.put("k", "v");
  own.stop();
  const auto started = Clock::now();
  try {
    client.put("k", "w");
    FAIL() << "a put reached a stopped etcd";
  } catch (const NetworkError& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_NE(message.find(own.endpoints().front().text()), std::string::npos) << message;
  } catch (const TimeoutError& error) {
    EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos) << error.what();
  }
  EXPECT_THROW(client.get("k"), NetworkError);  // picking again finds nothing
  EXPECT_LT(Clock::now() - started, 5s);
}

}  // namespace
}  // namespace dlrun::rendezvous::etcd
