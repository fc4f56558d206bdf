// The store proxy (store_proxy.h) between real clients and a real store server: every op
// through it as straight to the store, ADDs coalesced into distinct values, WAITs coalesced
// into one at the store, CANCEL_WAIT, blocking pops, and the clients closed when the store goes;
// and, against a scripted store, a WAIT that joins a group after its wake left the store.
#include "store/store_proxy.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <future>
#include <set>
#include <thread>

#include "common/asio.h"
#include "store/store_server.h"
#include "store/tcp_store.h"
#include "tests/store_test_util.h"

namespace dlrun {
namespace {

using testing::eventually;
using testing::i64Bytes;
using testing::RawClient;
using wire::Encoder;
using wire::Era;
using wire::Op;

// A store, and a proxy in front of it on an io_context of its own thread.
class StoreProxyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    store = std::make_unique<StoreServerThread>(StoreServerOptions{.listen = {"127.0.0.1", 0}});
    proxy = std::make_unique<StoreProxy>(
        io, StoreProxyOptions{.upstream = {"127.0.0.1", store->port()}});
    work.emplace(io.get_executor());
    thread = std::thread([this] { io.run(); });
  }
  void TearDown() override {
    boost::asio::post(io, [this] { proxy->stop(); });
    work.reset();
    thread.join();
    proxy.reset();
  }

  TcpStore client() { return TcpStore({.at = {"127.0.0.1", proxy->port()}}); }
  uint64_t storeOps(Op op) const { return store->stats().ops[static_cast<size_t>(op)]; }
  StoreProxyStats proxyStats() const { return proxy->stats(); }
  // A raw V2 client of the proxy, waiting on a key nobody writes.
  RawClient waitingOnNever() {
    RawClient raw(proxy->port());
    raw.validate();
    std::string wait;
    Encoder(wait).op(Era::V2, Op::Wait).u64(1).bytes("never");
    raw.send(wait);
    return raw;
  }

  boost::asio::io_context io;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work;
  std::unique_ptr<StoreServerThread> store;
  std::unique_ptr<StoreProxy> proxy;
  std::thread thread;
};

TEST_F(StoreProxyTest, EveryOpAsStraightToTheStore) {
  TcpStore c = client();
  c.set("a", "1");
  EXPECT_EQ(c.get("a"), "1");
  EXPECT_EQ(c.add("n", 5), 5);
  EXPECT_EQ(c.add("n", -2), 3);
  EXPECT_TRUE(c.check({"a", "n"}));
  EXPECT_FALSE(c.check({"a", "missing"}));
  EXPECT_EQ(c.compareSet("a", "1", "2"), "2");
  EXPECT_EQ(c.compareSet("a", "1", "3"), "2");
  c.append("a", "x");
  c.multiSet({"m1", "m2"}, {"v1", "v2"});
  EXPECT_EQ(c.multiGet({"a", "m1", "m2"}), (std::vector<std::string>{"2x", "v1", "v2"}));
  EXPECT_EQ(c.numKeys(), 4);
  EXPECT_TRUE(c.deleteKey("m1"));
  EXPECT_FALSE(c.deleteKey("m1"));
  c.ping();
  c.queuePush("q", "item");
  EXPECT_EQ(c.queueLen("q"), 1);
  EXPECT_EQ(c.queuePop("q", false), "item");
  EXPECT_EQ(c.queuePop("q", false), std::nullopt);
  // What the store holds is what the client wrote.
  TcpStore direct({.at = {"127.0.0.1", store->port()}});
  EXPECT_EQ(direct.get("a"), "2x");
  EXPECT_EQ(direct.get("n"), "3");
}

// ADDs pipelined on one connection reach the proxy together: the first goes alone, the other
// seven as one, and each still gets its own value, as if they had run one by one.
TEST_F(StoreProxyTest, AddsInFlightTogetherBecomeOneAndGetDistinctValues) {
  RawClient raw(proxy->port());
  raw.validate();
  std::string adds;
  for (int i = 1; i <= 8; ++i) Encoder(adds).op(Era::V2, Op::Add).bytes("counter").i64(i);
  raw.send(adds);
  int64_t expected = 0;
  for (int i = 1; i <= 8; ++i) EXPECT_EQ(raw.read(8), i64Bytes(expected += i));
  // Read in one turn of the proxy's loop, all eight go up as one.
  EXPECT_EQ(storeOps(Op::Add), 1u);
  EXPECT_EQ(proxyStats().coalescedAdds, 7u);
}

TEST_F(StoreProxyTest, EightWorkersAddingAtOnceGetEightDistinctValues) {
  std::vector<std::future<int64_t>> adds;
  for (int i = 0; i < 8; ++i)
    adds.push_back(std::async(std::launch::async, [this] { return client().add("k", 3); }));
  std::set<int64_t> values;
  for (auto& add : adds) values.insert(add.get());
  EXPECT_EQ(values, (std::set<int64_t>{3, 6, 9, 12, 15, 18, 21, 24}));
  EXPECT_EQ(client().get("k"), "24");
}

// Every local worker waiting on one key costs the store one WAIT.
TEST_F(StoreProxyTest, WaitsOnOneKeyBecomeOneWaitAtTheStore) {
  std::vector<std::future<void>> waits;
  for (int i = 0; i < 8; ++i)
    waits.push_back(std::async(std::launch::async,
                               [this] { client().wait({"ready"}, std::chrono::seconds(30)); }));
  ASSERT_TRUE(eventually([&] { return proxyStats().coalescedWaits == 7; }));
  client().set("ready", "1");
  for (auto& wait : waits) wait.get();
  EXPECT_EQ(storeOps(Op::GroupWait), 1u);
  EXPECT_EQ(storeOps(Op::Wait), 0u);
}

// Waits on distinct keys and the immediate ops around them share the proxy's one connection.
TEST_F(StoreProxyTest, OneConnectionCarriesEveryWaitAndEveryAdd) {
  std::vector<std::future<int64_t>> waits;
  for (int i = 0; i < 4; ++i)
    waits.push_back(std::async(std::launch::async, [this, i] {
      TcpStore c = client();
      c.wait({"key" + std::to_string(i)}, std::chrono::seconds(30));
      return c.add("after", 1);
    }));
  ASSERT_TRUE(eventually([&] { return storeOps(Op::GroupWait) == 4; }));
  TcpStore writer = client();
  EXPECT_TRUE(writer.multiGet({}).empty());  // a reply of no bytes, framed or not
  EXPECT_EQ(writer.add("before", 1), 1);
  for (int i : {2, 0, 3, 1}) writer.set("key" + std::to_string(i), "x");  // out of turn
  std::set<int64_t> values;
  for (auto& wait : waits) values.insert(wait.get());
  EXPECT_EQ(values, (std::set<int64_t>{1, 2, 3, 4}));
  EXPECT_EQ(store->stats().connections, 1u);
  EXPECT_EQ(proxyStats().upstreamConnections, 1u);
}

// A wait every client gave up on is withdrawn at the store (GROUP_CANCEL), on the same
// connection, which goes on serving.
TEST_F(StoreProxyTest, AWaitEveryClientGaveUpOnIsWithdrawnAtTheStore) {
  RawClient raw = waitingOnNever();
  ASSERT_TRUE(eventually([&] { return storeOps(Op::GroupWait) == 1; }));
  std::string cancel;
  Encoder(cancel).op(Era::V2, Op::CancelWait);
  raw.send(cancel);
  EXPECT_EQ(raw.read(1), std::string(1, static_cast<char>(wire::WaitReply::WaitCanceled)));
  ASSERT_TRUE(eventually([&] { return storeOps(Op::GroupCancel) == 1; }));
  EXPECT_EQ(client().add("n", 1), 1);  // the store's waiter count is as of this request
  EXPECT_EQ(store->stats().waiters, 0u);
  EXPECT_EQ(store->stats().connections, 1u);
}

TEST_F(StoreProxyTest, ACanceledWaitIsAnsweredCanceledOnly) {
  RawClient raw(proxy->port());
  raw.validate();
  std::string wait;
  Encoder(wait).op(Era::V2, Op::Wait).u64(1).bytes("never");
  raw.send(wait);
  std::string cancel;
  Encoder(cancel).op(Era::V2, Op::CancelWait);
  raw.send(cancel);
  EXPECT_EQ(raw.read(1), std::string(1, static_cast<char>(wire::WaitReply::WaitCanceled)));
  // The connection goes on in step.
  std::string add;
  Encoder(add).op(Era::V2, Op::Add).bytes("after").i64(1);
  raw.send(add);
  EXPECT_EQ(raw.read(8), i64Bytes(1));
}

// Two blocking pops woken by one WAIT: one push releases one of them, the next the other.
TEST_F(StoreProxyTest, OnePushReleasesOneBlockedPopper) {
  auto pop = [this] { return client().queuePop("jobs", true); };
  auto first = std::async(std::launch::async, pop);
  auto second = std::async(std::launch::async, pop);
  ASSERT_TRUE(eventually([&] { return proxyStats().coalescedWaits == 1; }));
  TcpStore pusher = client();
  pusher.queuePush("jobs", "one");
  std::vector<std::future<std::optional<std::string>>*> pending{&first, &second};
  std::optional<std::string> got;
  ASSERT_TRUE(eventually([&] {
    for (auto* f : pending)
      if (f->wait_for(std::chrono::seconds(0)) == std::future_status::ready) return true;
    return false;
  }));
  auto done =
      first.wait_for(std::chrono::seconds(0)) == std::future_status::ready ? &first : &second;
  auto other = done == &first ? &second : &first;
  EXPECT_EQ(done->get(), "one");
  EXPECT_NE(other->wait_for(std::chrono::milliseconds(300)), std::future_status::ready);
  pusher.queuePush("jobs", "two");
  EXPECT_EQ(other->get(), "two");
}

// torch 1.x gives up on a WAIT without a word (it has no CANCEL_WAIT): the store answers the
// client's next requests all the same, and so must the proxy.
TEST_F(StoreProxyTest, AnAbandonedWaitHoldsUpNoLaterReply) {
  RawClient raw(proxy->port());
  std::string requests;
  Encoder(requests).op(Era::V1, Op::Wait).u64(1).bytes("never");
  Encoder(requests).op(Era::V1, Op::Add).bytes("n").i64(2);
  raw.send(requests);
  EXPECT_EQ(raw.read(8), i64Bytes(2));
}

// A canceled BARRIER leaves its arrival counted, as the store leaves it.
TEST_F(StoreProxyTest, ACanceledBarrierIsWithdrawn) {
  RawClient raw(proxy->port());
  raw.validate();
  std::string barrier;
  Encoder(barrier).op(Era::V2, Op::Barrier).bytes("b").i64(2);
  raw.send(barrier);
  ASSERT_TRUE(eventually([&] { return storeOps(Op::Barrier) == 1; }));
  std::string cancel;
  Encoder(cancel).op(Era::V2, Op::CancelWait);
  raw.send(cancel);
  EXPECT_EQ(raw.read(1), std::string(1, static_cast<char>(wire::WaitReply::WaitCanceled)));
  // The barrier's connection is gone; the shared one, which carried the PING before it, stays.
  ASSERT_TRUE(eventually([&] { return store->stats().open == 1; }));
  EXPECT_EQ(client().get("b"), "1");
}

// ADDs of both signs are not summed into one: each gets the value it would get alone.
TEST_F(StoreProxyTest, AddsOfBothSignsGetTheirOneByOneValues) {
  RawClient raw(proxy->port());
  raw.validate();
  std::string adds;
  for (int64_t delta : {5, -3, 2}) Encoder(adds).op(Era::V2, Op::Add).bytes("n").i64(delta);
  raw.send(adds);
  for (int64_t value : {5, 2, 4}) EXPECT_EQ(raw.read(8), i64Bytes(value));
  EXPECT_EQ(storeOps(Op::Add), 3u);
}

// A client's requests reach the store in the order it sent them, an ADD held for the end of
// the proxy's loop turn (to be summed with others) included.
TEST_F(StoreProxyTest, AnAddAndTheRequestsPipelinedAfterItKeepTheirOrder) {
  RawClient raw(proxy->port());
  raw.validate();
  std::string requests;
  Encoder(requests).op(Era::V2, Op::Add).bytes("k").i64(1);
  Encoder(requests).op(Era::V2, Op::Set).bytes("k").bytes("10");
  Encoder(requests).op(Era::V2, Op::Get).bytes("k");
  raw.send(requests);
  EXPECT_EQ(raw.read(8), i64Bytes(1));
  std::string ten;
  Encoder(ten).bytes("10");
  EXPECT_EQ(raw.read(ten.size()), ten);
}

// An ADD the store refuses (it overflows) is refused as straight to the store: the client's
// connection closes and the ADD after it, which would fit, is not applied either.
TEST_F(StoreProxyTest, AnOverflowingAddIsRefusedAsStraightToTheStore) {
  EXPECT_EQ(client().add("k", 10), 10);
  RawClient raw(proxy->port());
  raw.validate();
  std::string adds;
  Encoder(adds).op(Era::V2, Op::Add).bytes("k").i64(INT64_MAX);
  Encoder(adds).op(Era::V2, Op::Add).bytes("k").i64(-20);
  raw.send(adds);
  EXPECT_TRUE(raw.closedByServer());
  TcpStore direct({.at = {"127.0.0.1", store->port()}});
  EXPECT_EQ(direct.get("k"), "10");
}

// A push releases one waiter of a group, and the group waits on once that client's next
// request is answered; when that request is itself a WAIT, it is answered as the store would.
TEST_F(StoreProxyTest, TheNextWaitOfAClientAPushReleasedIsAnswered) {
  std::string wait;
  Encoder(wait).op(Era::V2, Op::Wait).u64(1).bytes("jobs");
  RawClient first(proxy->port());
  first.validate();
  first.send(wait);
  ASSERT_TRUE(eventually([&] { return storeOps(Op::GroupWait) == 1; }));
  RawClient second(proxy->port());
  second.validate();
  second.send(wait);
  ASSERT_TRUE(eventually([&] { return proxyStats().coalescedWaits == 1; }));
  client().queuePush("jobs", "one");
  const std::string stop(1, static_cast<char>(wire::WaitReply::StopWaiting));
  EXPECT_EQ(first.read(1), stop);
  first.send(wait);  // the item is still there: the store answers this at once
  EXPECT_EQ(first.read(1), stop);
}

// A SET sent just before a BARRIER is in the store when the BARRIER counts the arrival, as on
// one connection, though the proxy's connection to the store is still busy with another
// client's large value.
TEST_F(StoreProxyTest, ASetBeforeABarrierIsInTheStoreWhenTheArrivalCounts) {
  std::string barrier;
  Encoder(barrier).op(Era::V2, Op::Barrier).bytes("b").i64(2);
  RawClient waiter(store->port());  // the barrier's other member, straight to the store
  waiter.validate();
  waiter.send(barrier);
  ASSERT_TRUE(eventually([&] { return storeOps(Op::Barrier) == 1; }));
  RawClient other(proxy->port());
  other.validate();
  std::string big;
  for (int i = 0; i < 3; ++i)
    Encoder(big).op(Era::V2, Op::Set).bytes("big").bytes(std::string(15 << 20, 'x'));
  other.send(big);
  RawClient member(proxy->port());
  member.validate();
  std::string requests;
  Encoder(requests).op(Era::V2, Op::Set).bytes("mine").bytes("x");
  requests += barrier;
  member.send(requests);
  const std::string stop(1, static_cast<char>(wire::WaitReply::StopWaiting));
  EXPECT_EQ(waiter.read(1), stop);
  TcpStore direct({.at = {"127.0.0.1", store->port()}});
  EXPECT_TRUE(direct.check({"mine"}));
  EXPECT_EQ(member.read(1), stop);
}

TEST_F(StoreProxyTest, VersionOneClientsPassToo) {
  RawClient raw(proxy->port());  // torch 1.x: no VALIDATE, its own op codes
  std::string add;
  Encoder(add).op(Era::V1, Op::Add).bytes("old").i64(4);
  raw.send(add);
  EXPECT_EQ(raw.read(8), i64Bytes(4));
  EXPECT_EQ(client().add("old", 1), 5);
}

TEST_F(StoreProxyTest, LeaseIsRefused) {
  RawClient raw(proxy->port());
  raw.validate();
  std::string lease;
  Encoder(lease).op(Era::V2, Op::Lease).bytes("k").bytes("v").u64(1000).u64(0);
  raw.send(lease);
  EXPECT_TRUE(raw.closedByServer());
}

// A proxy's upstream is the store: another proxy's GROUP_WAIT is refused, not mis-forwarded.
TEST_F(StoreProxyTest, GroupWaitFromAnotherProxyIsRefused) {
  RawClient raw(proxy->port());
  raw.validate();
  std::string wait;
  Encoder(wait).op(Era::V2, Op::GroupWait).u64(1).bytes("k");
  raw.send(wait);
  EXPECT_TRUE(raw.closedByServer());
}

TEST_F(StoreProxyTest, WhenTheStoreGoesEveryClientIsClosed) {
  RawClient raw = waitingOnNever();
  ASSERT_TRUE(eventually([&] { return storeOps(Op::GroupWait) == 1; }));
  store.reset();
  EXPECT_TRUE(raw.closedByServer());
}

// Every socket the proxy opens is close-on-exec: a program the agent executes (a worker)
// inherits none, its connection to the store included.
TEST_F(StoreProxyTest, AProgramExecutedMeanwhileInheritsNoSocket) {
  TcpStore worker = client();
  EXPECT_EQ(worker.add("n", 1), 1);  // the proxy's connection to the store is open now
  const pid_t child = ::fork();
  if (child == 0) {
    ::execl("/bin/sh", "sh", "-c", "! ls -l /proc/self/fd | grep -q 'socket:'", nullptr);
    ::_exit(127);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a socket was inherited";
}

// A store the test scripts byte by byte: it reads the proxy's requests and answers when told,
// so a wake can be on its way while a client joins.
class ScriptedStore {
 public:
  ScriptedStore() {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in at{};
    at.sin_family = AF_INET;
    at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t size = sizeof at;
    if (::bind(listener_, reinterpret_cast<sockaddr*>(&at), size) != 0 ||
        ::listen(listener_, 1) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&at), &size) != 0)
      throw Error("cannot listen for the scripted store");
    port_ = ntohs(at.sin_port);
  }
  ~ScriptedStore() {
    for (int fd : {listener_, peer_})
      if (fd >= 0) ::close(fd);
  }
  uint16_t port() const { return port_; }

  // The next `expected.size()` bytes from the proxy (accepting its connection first), or what
  // came of them within 10 s.
  std::string read(const std::string& expected) {
    if (peer_ < 0 && readable(listener_))
      peer_ = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    std::string got;
    char byte;
    while (peer_ >= 0 && got.size() < expected.size() && readable(peer_) &&
           ::read(peer_, &byte, 1) == 1)
      got.push_back(byte);
    return got;
  }
  void send(const std::string& bytes) {
    [[maybe_unused]] ssize_t n = ::write(peer_, bytes.data(), bytes.size());
  }

 private:
  static bool readable(int fd) {
    pollfd p{.fd = fd, .events = POLLIN, .revents = 0};
    return ::poll(&p, 1, 10'000) == 1;
  }
  int listener_ = -1, peer_ = -1;
  uint16_t port_ = 0;
};

std::string groupWake(uint64_t number, wire::WaitReply reply) {
  std::string out;
  Encoder(out)
      .u8(static_cast<uint8_t>(wire::FramedReply::GroupWait))
      .u64(number)
      .u8(static_cast<uint8_t>(reply));
  return out;
}

// The store wakes a group's WAIT (its key was set), a client joins the group before the wake
// arrives, having seen the key deleted again: the wake released the others, not that client,
// whose own question to the store (a CHECK) finds no key, so it waits on.
TEST(StoreProxyJoin, AWaitJoiningAGroupWhoseWakeIsOnItsWayWaitsForItsOwnAnswer) {
  ScriptedStore store;
  boost::asio::io_context io;
  StoreProxy proxy(io, StoreProxyOptions{.upstream = {"127.0.0.1", store.port()}});
  auto work = boost::asio::make_work_guard(io);
  std::thread thread([&] { io.run(); });
  struct Stopper {  // also when a read below throws
    std::function<void()> stop;
    ~Stopper() { stop(); }
  } stopper{[&] {
    boost::asio::post(io, [&] { proxy.stop(); });
    work.reset();
    thread.join();
  }};
  std::string hello, wait, groupWait, check;
  Encoder(hello).op(Era::V2, Op::Validate).u32(wire::kValidationMagic);
  Encoder(wait).op(Era::V2, Op::Wait).u64(1).bytes("k");
  Encoder(groupWait).op(Era::V2, Op::GroupWait).u64(1).bytes("k");
  Encoder(check).op(Era::V2, Op::Check).u64(1).bytes("k");
  RawClient first(proxy.port()), late(proxy.port());
  first.validate();
  late.validate();
  first.send(wait);
  EXPECT_EQ(store.read(hello + groupWait), hello + groupWait);
  late.send(wait);
  EXPECT_TRUE(eventually([&] { return proxy.stats().coalescedWaits == 1; }));
  store.send(groupWake(0, wire::WaitReply::StopWaiting));  // sent before the join
  const std::string stop(1, static_cast<char>(wire::WaitReply::StopWaiting));
  EXPECT_EQ(first.read(1), stop);
  EXPECT_EQ(store.read(check), check);
  std::string notReady;
  Encoder(notReady)
      .u8(static_cast<uint8_t>(wire::FramedReply::InOrder))
      .u8(static_cast<uint8_t>(wire::CheckReply::NotReady));
  store.send(notReady);
  EXPECT_EQ(store.read(groupWait), groupWait);  // the late client's own wait
  std::string ping, echo;
  Encoder(ping).op(Era::V2, Op::Ping).u32(7);
  Encoder(echo).u32(7);
  late.send(ping);
  EXPECT_EQ(late.read(4), echo);  // its WAIT not answered yet
  store.send(groupWake(1, wire::WaitReply::StopWaiting));
  EXPECT_EQ(late.read(1), stop);
}

}  // namespace
}  // namespace dlrun
