// EtcdStore, the LeasingStore on etcd, against a real etcd (tests/etcd_server.h): every op with
// dlrund's semantics, waits, and leases with emulated tripwires, fired by an abort, by a
// watcher when a lease is revoked elsewhere, and by a watcher when the holder is killed (a
// helper process: this program run again with DLRUN_ETCD_HELPER set, then SIGKILLed).
#include "rendezvous/etcd/etcd_store.h"
#include "rendezvous/etcd/etcd_expiry.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <future>
#include <sstream>
#include <thread>

#include "common/clock.h"
#include "common/error.h"
#include "tests/etcd_server.h"

namespace dlrun::rendezvous::etcd {
namespace {

using namespace std::chrono_literals;

// "PORT PREFIX" in a helper process: the etcd and the keys of the test that started it.
const char* helperArgument() { return std::getenv("DLRUN_ETCD_HELPER"); }

EtcdStoreOptions storeOptions(const std::vector<Endpoint>& endpoints, const std::string& prefix) {
  return {.client = {.endpoints = endpoints, .timeout = 5s, .connectTimeout = 5s},
          .prefix = prefix,
          .timeout = 5s};
}

// The helper process plays a node that holds a lease until it is killed. It runs as this
// program's first environment, so it needs no test of its own (gtest sets environments up only
// when some test is selected: the parent selects any one).
class HelperEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* argument = helperArgument();
    if (!argument) return;
    std::istringstream in(argument);
    int port = 0;
    std::string prefix;
    in >> port >> prefix;
    EtcdStore holder(storeOptions({{"127.0.0.1", static_cast<uint16_t>(port)}}, prefix));
    holder.lease("node", "record", 2s, {{"end", "lost"}});
    holder.set("ready", "1");
    std::this_thread::sleep_for(60s);  // the parent kills it long before
    _exit(1);
  }
};

[[maybe_unused]] auto* const helper = ::testing::AddGlobalTestEnvironment(new HelperEnvironment);
[[maybe_unused]] auto* const environment =
    ::testing::AddGlobalTestEnvironment(new test::EtcdEnvironment(helperArgument() == nullptr));

class EtcdStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server = test::sharedEtcd();
    ASSERT_NE(server, nullptr) << "etcd is not running";
    // A clean slate, also when the test runs again (--gtest_repeat) against the same etcd.
    EtcdClient(storeOptions(server->endpoints(), prefix()).client)
        .deleteRange(prefix(), EtcdClient::prefixEnd(prefix()));
  }
  // Stores of this test only: a prefix of its own.
  std::string prefix() const {
    return std::string("test/") + ::testing::UnitTest::GetInstance()->current_test_info()->name() +
           "/";
  }
  std::unique_ptr<EtcdStore> store() {
    return std::make_unique<EtcdStore>(storeOptions(server->endpoints(), prefix()));
  }
  test::EtcdServer* server = nullptr;
};

TEST_F(EtcdStoreTest, EveryOperation) {
  auto s = store();
  s->set("k", std::string("\0bin", 4));
  EXPECT_EQ(s->get("k"), std::string("\0bin", 4));
  EXPECT_EQ(s->add("n", 10), 10);
  EXPECT_EQ(s->add("n", -3), 7);
  EXPECT_TRUE(s->check({"k", "n"}));
  EXPECT_FALSE(s->check({"k", "absent"}));
  s->append("l", "ab");
  s->append("l", "cd");
  s->multiSet({"m1", "m2", "m1"}, {"1", "2", "3"});  // a key twice: the last value wins
  EXPECT_EQ(s->multiGet({"l", "m1", "m2"}), (std::vector<std::string>{"abcd", "3", "2"}));
  EXPECT_EQ(s->peek({"m2", "absent"}), (std::vector<std::string>{"2", ""}));
  EXPECT_EQ(s->numKeys(), 5);
  EXPECT_TRUE(s->deleteKey("l"));
  EXPECT_FALSE(s->deleteKey("l"));
  EXPECT_EQ(s->numKeys(), 4);
  EXPECT_THROW(s->multiSet({"a"}, {}), Error);
}

TEST_F(EtcdStoreTest, CompareSetFollowsPyTorch) {
  auto s = store();
  EXPECT_EQ(s->compareSet("absent", "x", "y"), "x");  // missing, not created
  EXPECT_FALSE(s->check({"absent"}));
  EXPECT_EQ(s->compareSet("c", "", "first"), "first");  // missing + empty expected: created
  EXPECT_EQ(s->compareSet("c", "", "second"), "first");
  EXPECT_EQ(s->compareSet("c", "wrong", "second"), "first");
  EXPECT_EQ(s->compareSet("c", "first", "second"), "second");
  s->set("empty", "");
  EXPECT_EQ(s->compareSet("empty", "", "filled"), "filled");  // an empty value matches too
}

// The closer's claim with its read of the records: one transaction, whether it creates the key
// or finds another closer's.
TEST_F(EtcdStoreTest, CreateThenPeekIsOneTransaction) {
  auto s = store();
  s->set("r1", "one");
  const auto txns = [&] { return server->requestsStarted()["Txn"]; };
  const auto before = txns();
  EXPECT_EQ(s->createThenPeek("claim", "7", {"r1", "r2"}),
            (std::vector<std::string>{"7", "one", ""}));
  EXPECT_EQ(s->createThenPeek("claim", "8", {"r1"}), (std::vector<std::string>{"7", "one"}));
  EXPECT_EQ(txns() - before, 2);
  // An empty value matches as compareSet's empty `expected` does.
  s->set("empty", "");
  EXPECT_EQ(s->createThenPeek("empty", "filled", {"r1"}),
            (std::vector<std::string>{"filled", "one"}));
}

// The rendezvous prepares its lease when it connects: the grant goes on while the store
// serves other requests, and lease() then sends none.
TEST_F(EtcdStoreTest, ALeasePreparedAheadIsGrantedWithoutWaitingForLease) {
  auto s = store();
  const auto grants = [&] { return server->requestsStarted()["LeaseGrant"]; };
  const auto before = grants();
  s->prepareLease(2s);
  s->prepareLease(2s);  // one on its way: nothing more
  s->set("other", "request");
  const auto deadline = Clock::now() + 5s;
  while (grants() == before && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(grants(), before + 1);
  s->lease("node", "record", 2s, {{"end", "lost"}});
  s->prepareLease(2s);  // held: nothing more
  EXPECT_EQ(grants(), before + 1);
  EXPECT_EQ(s->peek({"node"})[0], "record");
  s->abort();  // the lease works: revoked, its tripwire fired
  EXPECT_EQ(store()->peek({"node", "end"}), (std::vector<std::string>{"", "lost"}));
}

// A prepared grant taken late (a round this node sat out) is not used: its lease ran from the
// grant, and the keep-alive's first renewal comes an interval after lease().
TEST_F(EtcdStoreTest, AStalePreparedGrantIsGrantedAgain) {
  auto s = store();
  const auto grants = [&] { return server->requestsStarted()["LeaseGrant"]; };
  const auto before = grants();
  s->prepareLease(2s);
  std::this_thread::sleep_for(300ms);  // past a tenth of the TTL
  s->lease("node", "record", 2s, {});
  EXPECT_EQ(grants(), before + 2);
  EXPECT_EQ(s->peek({"node"})[0], "record");
}

TEST_F(EtcdStoreTest, ManyKeysCrossTheTransactionLimit) {
  auto s = store();
  std::vector<std::string> keys, values;
  for (int i = 0; i < 300; ++i) {
    keys.push_back("many/" + std::to_string(i));
    values.push_back(std::to_string(i * i));
  }
  s->multiSet(keys, values);
  EXPECT_EQ(s->peek(keys), values);
  EXPECT_TRUE(s->waitFor(keys, 1s));
  // Too many for one transaction: in steps, with the same answers.
  auto claimed = s->createThenPeek("claim", "1", keys);
  EXPECT_EQ(claimed.front(), "1");
  EXPECT_EQ(std::vector(claimed.begin() + 1, claimed.end()), values);
}

TEST_F(EtcdStoreTest, WaitsEndWhenAnotherStoreSetsTheKeyAndGiveUpOnTime) {
  auto waiter = store(), setter = store();
  auto started = Clock::now();
  EXPECT_FALSE(waiter->waitFor({"go"}, 300ms));
  EXPECT_GE(Clock::now() - started, 300ms);
  EXPECT_LT(Clock::now() - started, 3s);
  auto later = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(200ms);
    setter->set("go", "1");
  });
  started = Clock::now();
  EXPECT_TRUE(waiter->waitFor({"go", "pre"}, 100ms) == false);  // "pre" is missing
  setter->set("pre", "0");
  EXPECT_TRUE(waiter->waitFor({"go", "pre"}, 10s));
  EXPECT_LT(Clock::now() - started, 5s);
  later.get();
  EXPECT_EQ(waiter->get("go"), "1");
  EtcdStore quick(
      {.client = {.endpoints = server->endpoints()}, .prefix = prefix(), .timeout = 200ms});
  EXPECT_THROW(quick.get("never"), TimeoutError);
}

TEST_F(EtcdStoreTest, AWaitQueuedBehindAnotherOnOneStoreStillEndsOnTime) {
  auto s = store(), setter = store();
  auto longWait = std::async(std::launch::async, [&] { return s->waitFor({"late"}, 3s); });
  std::this_thread::sleep_for(100ms);  // let it hold the store's watch
  const auto started = Clock::now();
  EXPECT_FALSE(s->waitFor({"never"}, 300ms));
  EXPECT_LT(Clock::now() - started, 2s);
  setter->set("late", "1");
  EXPECT_TRUE(longWait.get());
}

TEST_F(EtcdStoreTest, AbortFiresTheTripwiresAndTheFirstWriterWins) {
  auto holder = store(), other = store();
  other->set("end", "written before");
  holder->lease("node", "record", 2s, {{"closed", "abort"}, {"end", "lost"}, {"lost/me", "1"}});
  EXPECT_EQ(other->peek({"node"}), (std::vector<std::string>{"record"}));
  auto waiting = std::async(std::launch::async, [&] { return other->waitFor({"closed"}, 10s); });
  const auto started = Clock::now();
  holder->abort();
  EXPECT_TRUE(waiting.get());
  EXPECT_LT(Clock::now() - started, 3s);
  EXPECT_EQ(other->peek({"node", "closed", "end", "lost/me"}),
            (std::vector<std::string>{"", "abort", "written before", "1"}));
  EXPECT_THROW(holder->set("x", "y"), NetworkError);
  EXPECT_THROW(holder->waitFor({"x"}, 1s), NetworkError);
}

TEST_F(EtcdStoreTest, AbortCutsABlockedWaitAtOnce) {
  auto s = store();
  auto waiting = std::async(std::launch::async, [&] { return s->waitFor({"never"}, 30s); });
  std::this_thread::sleep_for(300ms);  // let the wait block
  const auto started = Clock::now();
  s->abort();
  try {
    waiting.get();
    FAIL() << "the wait outlived abort()";
  } catch (const NetworkError& error) {
    EXPECT_NE(std::string(error.what()).find("aborted"), std::string::npos) << error.what();
  }
  EXPECT_LT(Clock::now() - started, 2s);
}

TEST_F(EtcdStoreTest, AbortReturnsSoonWhenEtcdIsGone) {
  test::EtcdServer own;  // not the shared one: this test stops it
  own.start();
  auto holder = std::make_unique<EtcdStore>(storeOptions(own.endpoints(), prefix()));
  holder->lease("a", "1", 2s, {{"end", "lost"}});
  holder->lease("b", "2", 5s, {{"end", "lost"}});  // a second lease: a second TTL
  own.stop();
  const auto started = Clock::now();
  holder->abort();
  holder.reset();
  EXPECT_LT(Clock::now() - started, 3s);
}

TEST_F(EtcdStoreTest, AReleaseFiresNothing) {
  auto other = store();
  {
    auto holder = store();
    holder->lease("node", "record", 2s, {{"end", "lost"}});
    EXPECT_TRUE(holder->deleteKey("node"));
  }  // destroyed: its lease is revoked, with nothing left on it
  EXPECT_FALSE(other->waitFor({"end"}, 1s));
  EXPECT_FALSE(other->check({"node"}));
}

TEST_F(EtcdStoreTest, DeleteKeysReleasesManyAtOnceAndFiresNothing) {
  auto holder = store(), other = store();
  std::vector<std::string> keys;
  for (int i = 0; i < 150; ++i) keys.push_back("old/" + std::to_string(i));
  holder->multiSet(keys, keys);
  holder->lease("old/node", "record", 2s, {{"end", "lost"}});
  keys.push_back("old/node");
  keys.push_back("old/never-set");
  holder->deleteKeys(keys);
  EXPECT_EQ(holder->numKeys(), 0);
  holder.reset();  // nothing leased is left to revoke
  EXPECT_FALSE(other->waitFor({"end"}, 1s));
}

TEST_F(EtcdStoreTest, AddsLeaveNoMarkBehind) {
  {
    auto s = store();
    EXPECT_EQ(s->add("n", 1), 1);
    EXPECT_EQ(s->add("n", 1), 2);
    EXPECT_EQ(s->client().count(prefix() + "marks/", EtcdClient::prefixEnd(prefix() + "marks/")),
              1);  // one mark a store, rewritten by each add
  }
  EXPECT_EQ(EtcdClient(storeOptions(server->endpoints(), prefix()).client)
                .count(prefix() + "marks/", EtcdClient::prefixEnd(prefix() + "marks/")),
            0);
}

TEST_F(EtcdStoreTest, ALeaseRevokedElsewhereIsFiredByAWatcher) {
  auto holder = store(), watcher = store();
  holder->lease("node", "record", 2s, {{"end", "lost"}});
  auto waiting = std::async(std::launch::async, [&] { return watcher->waitFor({"end"}, 10s); });
  // The holder stays up and aborts nothing: only the watcher can fire.
  const int64_t lease = holder->client().get(prefix() + "kv/node")->lease;
  ASSERT_NE(lease, 0);
  holder->client().leaseRevoke(lease);
  EXPECT_TRUE(waiting.get());
  EXPECT_EQ(watcher->peek({"end", "node"}), (std::vector<std::string>{"lost", ""}));
}

// Under a job's prefix (etcd_prefix + ID + "/"), the rendezvous's own root ("dlrun/ID/") is not
// repeated: its keys, their tripwire records and what a lapse fires all live under one prefix.
TEST_F(EtcdStoreTest, KeysUnderTheRootAreStoredWithoutItAndTheirTripwiresStillFire) {
  auto options = storeOptions(server->endpoints(), prefix());
  options.root = "dlrun/job/";
  EtcdStore holder(options), watcher(options);
  holder.set("dlrun/job/current", "1");
  holder.set("elsewhere", "2");
  holder.lease("dlrun/job/node", "record", 2s, {{"dlrun/job/end", "lost"}});
  EXPECT_EQ(holder.etcdKey("dlrun/job/current"), prefix() + "kv/current");
  EXPECT_EQ(holder.client().get(prefix() + "kv/current")->value, "1");
  EXPECT_EQ(holder.client().get(prefix() + "kv/elsewhere")->value, "2");
  EXPECT_TRUE(holder.client().get(prefix() + "tripwires/node"));
  for (const auto& kv : holder.client().rangePrefix(prefix()).kvs)
    EXPECT_EQ(kv.key.find("dlrun/job/"), std::string::npos) << kv.key;
  EXPECT_EQ(watcher.get("dlrun/job/current"), "1");
  auto waiting =
      std::async(std::launch::async, [&] { return watcher.waitFor({"dlrun/job/end"}, 10s); });
  holder.client().leaseRevoke(holder.client().get(prefix() + "kv/node")->lease);
  EXPECT_TRUE(waiting.get());
  EXPECT_EQ(watcher.peek({"dlrun/job/end", "dlrun/job/node"}),
            (std::vector<std::string>{"lost", ""}));
}

// An ended job's keys: every one under the prefix moves onto one lease of the TTL, values kept,
// the marks written with it, keys elsewhere left alone; revoking it (as its lapse would)
// deletes them all.
TEST_F(EtcdStoreTest, ExpireKeysPutsEveryKeyOfThePrefixOnOneLease) {
  auto holder = store();
  holder->set("a", "1");
  holder->lease("node", "record", 2s, {{"end", "lost"}});
  EtcdClient& client = holder->client();
  const std::string outside = prefix().substr(0, prefix().size() - 1) + "-other";
  client.put(outside, "kept");
  // More keys than one transaction takes.
  for (size_t i = 0; i < kExpireBatch + 3; ++i)
    client.put(prefix() + "many/" + std::to_string(i), "v");
  const int64_t lease = expireKeys(client, prefix(), 60s, {{prefix() + "when", "then"}});
  const auto all = client.rangePrefix(prefix()).kvs;
  EXPECT_EQ(all.size(), kExpireBatch + 3 + 4);  // many/, a, node, its record, when
  for (const auto& kv : all) EXPECT_EQ(kv.lease, lease) << kv.key;
  EXPECT_EQ(client.get(prefix() + "kv/a")->value, "1");
  EXPECT_EQ(client.get(prefix() + "when")->value, "then");
  EXPECT_EQ(client.get(outside)->lease, 0);
  client.leaseRevoke(lease);
  EXPECT_EQ(client.count(prefix(), EtcdClient::prefixEnd(prefix())), 0);
  EXPECT_EQ(client.get(outside)->value, "kept");
  client.deleteKey(outside);
}

// expect(): the round's end is followed from the hint on, so the wait for the end and a read of
// it cost etcd nothing (no watch, no read), whether the end came before the hint or after; a
// key never seen is read.
TEST_F(EtcdStoreTest, AnExpectedKeyIsFollowedFromTheFirstWaitOnWithoutAnotherRequest) {
  auto waiter = store(), writer = store();
  writer->set("already", "1");
  waiter->expect({"end", "already", "never"});
  EXPECT_FALSE(waiter->waitFor({"closed"}, 100ms));
  writer->set("closed", "3");
  EXPECT_TRUE(waiter->waitFor({"closed"}, 5s));
  const auto before = server->requestsStarted();
  EXPECT_TRUE(waiter->waitFor({"already"}, 100ms));
  EXPECT_FALSE(waiter->waitFor({"never"}, 200ms));
  auto later = std::async(std::launch::async, [&] { return waiter->waitFor({"end"}, 10s); });
  writer->set("end", "finished");
  EXPECT_TRUE(later.get());
  EXPECT_EQ(waiter->peek({"end", "already"}), (std::vector<std::string>{"finished", "1"}));
  const auto after = server->requestsStarted();
  for (const char* method : {"Range", "Txn", "Watch"})  // the writer's puts are Put requests
    EXPECT_EQ(after.count(method) ? after.at(method) : 0,
              before.count(method) ? before.at(method) : 0)
        << method;
  EXPECT_EQ(waiter->peek({"end", "never"}), (std::vector<std::string>{"finished", ""}));
  // A key outside the hint still gets its watch and read.
  writer->set("other", "1");
  EXPECT_TRUE(waiter->waitFor({"other"}, 100ms));
}

// The rendezvous's arrival: a join and its record in one transaction. Each caller gets its own
// value and, up to the limit, a record under that value's key, leased as lease()'s is (abort()
// fires its tripwires); above the limit, nothing. The read expect() owes rides along, so a
// wait for an expected key that was already there costs no request.
TEST_F(EtcdStoreTest, AddThenLeaseJoinsAndLeasesInOneTransaction) {
  auto first = store(), second = store(), third = store(), other = store();
  other->set("closed", "2");
  const auto keyOf = [](int64_t n) { return "node/" + std::to_string(n); };
  const std::vector<std::pair<std::string, std::string>> tripwires{{"end", "lost"}};
  first->expect({"closed"});
  const auto requests = [&](const char* method) { return server->requestsStarted()[method]; };
  const int64_t txns = requests("Txn");
  EXPECT_EQ(first->addThenLease("joined", 2, keyOf, "one", 2s, tripwires), 1);
  EXPECT_EQ(requests("Txn") - txns, 1);
  const auto before = server->requestsStarted();
  EXPECT_TRUE(first->waitFor({"closed"}, 100ms));
  for (const char* method : {"Range", "Txn", "Watch"})
    EXPECT_EQ(requests(method), before.count(method) ? before.at(method) : 0) << method;
  EXPECT_EQ(second->addThenLease("joined", 2, keyOf, "two", 2s, tripwires), 2);
  EXPECT_EQ(third->addThenLease("joined", 2, keyOf, "three", 2s, tripwires), 3);
  EXPECT_EQ(other->peek({"joined", "node/1", "node/2", "node/3"}),
            (std::vector<std::string>{"3", "one", "two", ""}));
  second->abort();
  EXPECT_TRUE(other->waitFor({"end"}, 10s));
  EXPECT_EQ(other->peek({"node/1", "node/2", "end"}),
            (std::vector<std::string>{"one", "", "lost"}));
}

// An agent's stores share one client (one channel to etcd); each keeps its own leases, waits
// and abort(). A store that only observes (fireLapses = false, the control plane's) hears the
// puts it waits for but fires no lapsed lease: that is for the stores holding the job's leases.
TEST_F(EtcdStoreTest, StoresSharingAClientStayApartAndAnObserverFiresNothing) {
  auto options = storeOptions(server->endpoints(), prefix());
  const auto client = std::make_shared<EtcdClient>(options.client);
  EtcdStore holder(options, client);
  options.fireLapses = false;
  EtcdStore observer(options, client);
  holder.lease("node", "record", 2s, {{"end", "lost"}});
  auto waiting = std::async(std::launch::async, [&] { return observer.waitFor({"done"}, 10s); });
  holder.set("done", "1");
  EXPECT_TRUE(waiting.get());
  // Revoked behind the holder's back: only a firing watcher would write "end".
  const auto leased = client->get(prefix() + "kv/node");
  ASSERT_TRUE(leased.has_value());
  client->leaseRevoke(leased->lease);
  EXPECT_FALSE(observer.waitFor({"end"}, 1s));
  EXPECT_EQ(observer.peek({"end", "node"}), (std::vector<std::string>{"", ""}));
  holder.abort();
  EXPECT_THROW(holder.set("x", "1"), NetworkError);
  observer.set("x", "2");
  EXPECT_EQ(observer.peek({"x"}), std::vector<std::string>{"2"});
}

TEST_F(EtcdStoreTest, AKilledHoldersLeaseLapsesAndAWatcherFiresItsTripwires) {
  auto watcher = store();
  const std::string argument = std::to_string(server->clientPort()) + " " + prefix();
  const pid_t parent = getpid();
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    setenv("DLRUN_ETCD_HELPER", argument.c_str(), 1);
    execl("/proc/self/exe", "etcd_store_test", "--gtest_filter=EtcdStoreTest.EveryOperation",
          nullptr);
    _exit(127);
  }
  const bool ready = watcher->waitFor({"ready"}, 20s);
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  ASSERT_TRUE(ready) << "the helper did not lease in time";
  const auto killed = Clock::now();
  EXPECT_TRUE(watcher->check({"node"}));  // the lease outlives its holder by up to its TTL
  EXPECT_TRUE(watcher->waitFor({"end"}, 8s));
  const auto lapsed = Clock::now() - killed;
  EXPECT_LT(lapsed, 5s);  // TTL 2 s, renewed every 0.67 s, plus etcd's 0.5 s expiry sweep
  EXPECT_EQ(watcher->peek({"end", "node"}), (std::vector<std::string>{"lost", ""}));
}

}  // namespace
}  // namespace dlrun::rendezvous::etcd
