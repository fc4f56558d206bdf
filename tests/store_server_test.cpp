// The server on the wire: byte-exact 2.x framing, 1.x clients on the same port, and hostile
// input that must neither crash the server nor make it hold unbounded memory.
#include "store/store_server.h"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <future>
#include <random>

#include "store/tcp_store.h"
#include "tests/store_test_util.h"

namespace dlrun::rendezvous {
namespace {

using testing::i64Bytes;
using testing::lengthPrefixed;
using testing::RawClient;
using wire::Encoder;
using wire::Era;
using wire::Op;

class StoreServerTest : public ::testing::Test {
 protected:
  void start(wire::Limits limits = {}) {
    server = std::make_unique<StoreServerThread>(
        StoreServerOptions{.listen = {"127.0.0.1", 0}, .limits = limits});
  }
  void SetUp() override { start(); }

  // A well-behaved client still gets served.
  void expectServing() {
    TcpStore store({.at = {"127.0.0.1", server->port()}});
    store.set("alive", "yes");
    EXPECT_EQ(store.get("alive"), "yes");
  }

  static std::string v2(Op op) {
    std::string out;
    Encoder(out).op(Era::V2, op);
    return out;
  }

  // A V2 connection holding a lease on /k with the tripwire /trip=dead.
  std::unique_ptr<RawClient> leaseHolder(std::chrono::milliseconds ttl) {
    auto holder = std::make_unique<RawClient>(server->port());
    holder->validate();
    std::string lease;
    Encoder(lease).op(Era::V2, Op::Lease).bytes("/k").bytes("alive").u64(ttl.count()).u64(1);
    Encoder(lease).bytes("/trip").bytes("dead");
    holder->send(lease);
    EXPECT_EQ(holder->read(1), std::string(1, '\0'));
    return holder;
  }

  TcpStore client() { return TcpStore({.at = {"127.0.0.1", server->port()}}); }

  // A server on 127.0.0.1 that admits only 127.0.0.2; `foreign` as StoreServerOptions's.
  void startAdmittingOnly127002(std::function<void(int)> foreign = {}) {
    server = std::make_unique<StoreServerThread>(
        StoreServerOptions{.listen = {"127.0.0.1", 0},
                           .foreign = std::move(foreign),
                           .admission = AdmissionRule::parse("127.0.0.2", "--allow")});
  }

  std::unique_ptr<StoreServerThread> server;
};

TEST_F(StoreServerTest, ValidateHasNoReplyAndPingEchoesTheNonce) {
  RawClient c(server->port());
  c.validate();
  c.send(v2(Op::Ping) + std::string("\x78\x56\x34\x12", 4));
  EXPECT_EQ(c.read(4), std::string("\x78\x56\x34\x12", 4));
}

TEST_F(StoreServerTest, MultiSetThenMultiGetBytes) {
  RawClient c(server->port());
  c.validate();
  c.send(v2(Op::MultiSet) + i64Bytes(2) + lengthPrefixed("/a") + lengthPrefixed("1") +
         lengthPrefixed("/b") + lengthPrefixed(std::string("\0\xff", 2)));
  c.send(v2(Op::MultiGet) + i64Bytes(2) + lengthPrefixed("/b") + lengthPrefixed("/a"));
  EXPECT_EQ(c.read(8 + 2 + 8 + 1), lengthPrefixed(std::string("\0\xff", 2)) + lengthPrefixed("1"));
}

TEST_F(StoreServerTest, AppendCreatesThenExtends) {
  RawClient c(server->port());
  c.validate();
  c.send(v2(Op::Append) + lengthPrefixed("/l") + lengthPrefixed("ab"));
  c.send(v2(Op::Append) + lengthPrefixed("/l") + lengthPrefixed("cd"));
  c.send(v2(Op::Get) + lengthPrefixed("/l"));
  EXPECT_EQ(c.read(8 + 4), lengthPrefixed("abcd"));
}

TEST_F(StoreServerTest, CancelWaitAnswersCanceledAndKeepsTheConnectionInStep) {
  RawClient waiter(server->port()), setter(server->port());
  waiter.validate();
  setter.validate();
  waiter.send(v2(Op::Wait) + i64Bytes(1) + lengthPrefixed("/k"));
  waiter.send(v2(Op::CancelWait));
  EXPECT_EQ(waiter.read(1), std::string(1, '\x01'));  // WAIT_CANCELED, no STOP_WAITING
  setter.send(v2(Op::Set) + lengthPrefixed("/k") + lengthPrefixed("v"));
  waiter.send(v2(Op::Ping) + std::string(4, '\x01'));
  EXPECT_EQ(waiter.read(4), std::string(4, '\x01'));  // nothing stale arrived first
}

TEST_F(StoreServerTest, WaitIsAnsweredByAnotherConnectionsSet) {
  RawClient waiter(server->port()), setter(server->port());
  waiter.validate();
  setter.validate();
  waiter.send(v2(Op::Wait) + i64Bytes(1) + lengthPrefixed("/k"));
  setter.send(v2(Op::Set) + lengthPrefixed("/k") + lengthPrefixed("v"));
  EXPECT_EQ(waiter.read(1), std::string(1, '\0'));
}

TEST_F(StoreServerTest, QueuePushPopLenBytes) {
  RawClient popper(server->port()), pusher(server->port());
  popper.validate();
  pusher.validate();
  // A blocking pop is WAIT on the queue key, then QUEUE_POP.
  popper.send(v2(Op::Wait) + i64Bytes(1) + lengthPrefixed("/q"));
  pusher.send(v2(Op::QueuePush) + lengthPrefixed("/q") + lengthPrefixed("first"));
  pusher.send(v2(Op::QueuePush) + lengthPrefixed("/q") + lengthPrefixed("second"));
  EXPECT_EQ(popper.read(1), std::string(1, '\0'));
  popper.send(v2(Op::QueueLen) + lengthPrefixed("/q"));
  EXPECT_EQ(popper.read(8), i64Bytes(2));
  popper.send(v2(Op::QueuePop) + lengthPrefixed("/q"));
  EXPECT_EQ(popper.read(8 + 8 + 5), i64Bytes(2) + lengthPrefixed("first"));
  popper.send(v2(Op::QueuePop) + lengthPrefixed("/q"));
  EXPECT_EQ(popper.read(8 + 8 + 6), i64Bytes(1) + lengthPrefixed("second"));
  popper.send(v2(Op::QueuePop) + lengthPrefixed("/q"));
  EXPECT_EQ(popper.read(8), i64Bytes(0));
}

TEST_F(StoreServerTest, V1AndV2ClientsShareOneStore) {
  RawClient old(server->port()), current(server->port());
  std::string set;
  Encoder(set).op(Era::V1, Op::Set).bytes("/shared").bytes("from-1.x");
  old.send(set);
  current.validate();
  current.send(v2(Op::Get) + lengthPrefixed("/shared"));
  EXPECT_EQ(current.read(8 + 8), lengthPrefixed("from-1.x"));
  std::string add;
  Encoder(add).op(Era::V1, Op::Add).bytes("/n").i64(3);
  old.send(add);
  EXPECT_EQ(old.read(8), i64Bytes(3));
}

TEST_F(StoreServerTest, RandomBytesAreRefusedAndTheServerCarriesOn) {
  std::mt19937 random(42);
  for (int round = 0; round < 20; ++round) {
    RawClient c(server->port());
    std::string garbage(4096, '\0');
    for (auto& ch : garbage) ch = static_cast<char>(random());
    garbage[0] = static_cast<char>(0x41 + round);  // an op code that no era has
    c.send(garbage);
    EXPECT_TRUE(c.closedByServer());
  }
  expectServing();
}

TEST_F(StoreServerTest, AnHttpRequestIsRefused) {
  RawClient c(server->port());
  c.send("GET / HTTP/1.1\r\nHost: localhost\r\n\r\n");
  EXPECT_TRUE(c.closedByServer());
  expectServing();
}

// StoreServerOptions::foreign: a connection that opens with HTTP/2's preface leaves the store
// with its bytes unread, while store clients of both eras on the same port are served as ever.
TEST_F(StoreServerTest, AnHttp2ConnectionGoesToTheForeignServerWithItsBytesUnread) {
  std::promise<int> handedOver;
  server = std::make_unique<StoreServerThread>(StoreServerOptions{
      .listen = {"127.0.0.1", 0}, .foreign = [&](int fd) { handedOver.set_value(fd); }});
  RawClient http2(server->port());
  const std::string preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  http2.send(preface);
  auto fd = handedOver.get_future();
  ASSERT_EQ(fd.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  const int socket = fd.get();
  std::string received;
  while (received.size() < preface.size()) {
    pollfd readable{.fd = socket, .events = POLLIN};
    ASSERT_EQ(::poll(&readable, 1, 10'000), 1);
    char buffer[64];
    const ssize_t n = ::read(socket, buffer, sizeof(buffer));
    ASSERT_GT(n, 0);
    received.append(buffer, static_cast<size_t>(n));
  }
  EXPECT_EQ(received, preface);
  ASSERT_EQ(::write(socket, "ok", 2), 2);
  EXPECT_EQ(http2.read(2), "ok");
  ::close(socket);
  EXPECT_EQ(server->connectionCount(), 0u);  // no longer the store's
  EXPECT_EQ(server->stats().connections, 1u);
  EXPECT_EQ(server->stats().foreign, 1u);
  EXPECT_EQ(server->stats().requests(), 0u);

  RawClient old(server->port());
  std::string add;
  Encoder(add).op(Era::V1, Op::Add).bytes("/n").i64(3);
  old.send(add);
  EXPECT_EQ(old.read(8), i64Bytes(3));
  expectServing();
}

TEST_F(StoreServerTest, CountsConnectionsAndRequestsByOp) {
  EXPECT_EQ(server->stats().describe(), "connections=0 foreign=0 requests=0");
  RawClient c(server->port());
  c.validate();
  c.send(v2(Op::Set) + lengthPrefixed("/n") + lengthPrefixed("1"));
  c.send(v2(Op::Add) + lengthPrefixed("/n") + i64Bytes(2));
  EXPECT_EQ(c.read(8), i64Bytes(3));
  RawClient old(server->port());
  std::string add;
  Encoder(add).op(Era::V1, Op::Add).bytes("/n").i64(4);
  old.send(add);
  EXPECT_EQ(old.read(8), i64Bytes(7));  // every request so far is counted: each was answered
  const StoreStats stats = server->stats();
  EXPECT_EQ(stats.connections, 2u);
  EXPECT_EQ(stats.foreign, 0u);
  EXPECT_EQ(stats.requests(), 4u);
  EXPECT_EQ(stats.ops[static_cast<size_t>(Op::Add)], 2u);
  EXPECT_EQ(stats.describe(), "connections=2 foreign=0 requests=4 VALIDATE=1 SET=1 ADD=2");
}

TEST_F(StoreServerTest, AHugeLengthPrefixIsRefusedBeforeAnyPayload) {
  RawClient c(server->port());
  c.validate();
  c.send(v2(Op::Set) + lengthPrefixed("/k") + i64Bytes(int64_t{1} << 62) + "x");
  EXPECT_TRUE(c.closedByServer());
  expectServing();
}

TEST_F(StoreServerTest, AKeyOverTheLimitIsRefusedFromItsLength) {
  server.reset();
  start(wire::Limits{.maxKeyBytes = 64});
  RawClient c(server->port());
  c.validate();
  c.send(v2(Op::Get) + i64Bytes(65));  // the key itself is never sent
  EXPECT_TRUE(c.closedByServer());
  expectServing();
}

TEST_F(StoreServerTest, UnreadRepliesBeyondTheBufferLimitDropTheClient) {
  server.reset();
  start(wire::Limits{.maxBufferedBytes = 1 << 20});
  {
    TcpStore store({.at = {"127.0.0.1", server->port()}});
    store.set("big", std::string(512 * 1024, 'x'));
    ASSERT_TRUE(store.check({"big"}));  // a round trip: the SET is stored before the GETs come
  }
  RawClient c(server->port());
  c.validate();
  // Ask for the value again and again without reading: the replies pile up in the server
  // until the per-connection limit ends the connection.
  std::string get = v2(Op::Get) + lengthPrefixed("big");
  std::string many;
  for (int i = 0; i < 256; ++i) many += get;
  c.send(many);
  // Reading the replies would drain them, so watch the server's count instead.
  EXPECT_TRUE(testing::eventually([&] { return server->connectionCount() == 0; }));
  expectServing();
}

TEST_F(StoreServerTest, ARequestCutOffMidwayLeavesNothingBehind) {
  {
    RawClient c(server->port());
    c.validate();
    c.send(v2(Op::Set) + lengthPrefixed("/k") + i64Bytes(1000) + std::string(10, 'v'));
    RawClient w(server->port());
    w.validate();
    w.send(v2(Op::Wait) + i64Bytes(1) + lengthPrefixed("/never"));
  }  // both disconnect mid-request / mid-wait
  EXPECT_TRUE(testing::eventually([&] { return server->connectionCount() == 0; }));
  TcpStore store({.at = {"127.0.0.1", server->port()}});
  EXPECT_FALSE(store.check({"/k"}));
  EXPECT_EQ(store.numKeys(), 0);
  expectServing();
}

TEST_F(StoreServerTest, ALeaseHoldersClosedSocketWakesTheTripwiresWaiter) {
  auto holder = leaseHolder(std::chrono::minutes(10));
  RawClient waiter(server->port());
  waiter.validate();
  waiter.send(v2(Op::Wait) + i64Bytes(1) + lengthPrefixed("/trip"));
  holder->close();
  EXPECT_EQ(waiter.read(1), std::string(1, '\0'));  // long before the TTL
  EXPECT_FALSE(client().check({"/k"}));
}

TEST_F(StoreServerTest, ASilentLeaseHoldersTripwireAppearsAfterTheTtl) {
  auto holder = leaseHolder(std::chrono::milliseconds(200));
  EXPECT_TRUE(client().waitFor({"/trip"}, std::chrono::seconds(10)));
  EXPECT_EQ(client().get("/trip"), "dead");
  EXPECT_FALSE(client().check({"/k"}));
}

TEST_F(StoreServerTest, ALeaseHolderThatKeepsTalkingKeepsItsLease) {
  auto holder = leaseHolder(std::chrono::milliseconds(300));
  const auto end = Clock::now() + std::chrono::milliseconds(600);
  while (Clock::now() < end) {
    holder->send(v2(Op::Ping) + std::string(4, '\x05'));
    EXPECT_EQ(holder->read(4), std::string(4, '\x05'));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the keep-alive pace
  }
  TcpStore observer = client();
  EXPECT_TRUE(observer.check({"/k"}));
  EXPECT_FALSE(observer.check({"/trip"}));
  holder->close();  // the lease was live until now
  EXPECT_TRUE(observer.waitFor({"/trip"}, std::chrono::seconds(10)));
}

TEST_F(StoreServerTest, DeletingALeasedKeyReleasesItWithoutFiring) {
  auto holder = leaseHolder(std::chrono::milliseconds(200));
  holder->send(v2(Op::DeleteKey) + lengthPrefixed("/k"));
  EXPECT_EQ(holder->read(8), i64Bytes(1));
  holder->close();
  // Once the server has seen the close, a fired lease would have set the tripwire.
  EXPECT_TRUE(testing::eventually([&] { return server->connectionCount() == 0; }));
  EXPECT_FALSE(client().waitFor({"/trip"}, std::chrono::milliseconds(400)));  // past the TTL
}

// A client socket that connects from `source`: Linux routes all of 127/8 to loopback, so a
// socket bound to 127.0.0.2 reaches a server on 127.0.0.1 from another address.
class SourcedClient {
 public:
  SourcedClient(const char* source, uint16_t port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in at{.sin_family = AF_INET};
    ::inet_pton(AF_INET, source, &at.sin_addr);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&at), sizeof(at)), 0) << source;
    at.sin_port = htons(port);
    ::inet_pton(AF_INET, "127.0.0.1", &at.sin_addr);
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&at), sizeof(at)), 0);
  }
  ~SourcedClient() { ::close(fd_); }

  void send(const std::string& bytes) {
    ASSERT_EQ(::write(fd_, bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  // Up to `n` bytes, fewer when the server closes first; fails the test after 10 s.
  std::string read(size_t n) {
    std::string out;
    while (out.size() < n) {
      pollfd readable{.fd = fd_, .events = POLLIN};
      if (::poll(&readable, 1, 10'000) != 1) {
        ADD_FAILURE() << "no reply within 10 s";
        break;
      }
      char buffer[64];
      const ssize_t got = ::read(fd_, buffer, std::min(sizeof(buffer), n - out.size()));
      if (got <= 0) break;
      out.append(buffer, static_cast<size_t>(got));
    }
    return out;
  }

 private:
  int fd_;
};

// StoreServerOptions::admission: a peer not admitted is closed before anything is read from
// it, counted apart from protocol refusals, and logged once per address; allow() admits more.
TEST_F(StoreServerTest, APeerNotAdmittedIsClosedUnreadCountedAndLoggedOnce) {
  startAdmittingOnly127002();
  ::testing::internal::CaptureStderr();
  for (int attempt = 0; attempt < 3; ++attempt) {
    SourcedClient stranger("127.0.0.1", server->port());
    EXPECT_EQ(stranger.read(1), "");  // EOF, without sending anything first
  }
  EXPECT_TRUE(testing::eventually([&] { return server->stats().rejected == 3; }));
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string line =
      "store: refused a connection from 127.0.0.1 (not in the job's hosts or --allow)";
  EXPECT_NE(log.find(line), std::string::npos) << log;
  EXPECT_EQ(log.find(line), log.rfind(line)) << "logged more than once:\n" << log;

  SourcedClient node("127.0.0.2", server->port());
  std::string numKeys;
  Encoder(numKeys).op(Era::V1, Op::GetNumKeys);
  node.send(numKeys);
  EXPECT_EQ(node.read(8), i64Bytes(0));
  const StoreStats stats = server->stats();
  EXPECT_EQ(stats.connections, 1u);  // the admitted one only
  EXPECT_EQ(stats.refused, 0u);
  EXPECT_EQ(stats.describe(), "connections=1 foreign=0 rejected=3 requests=1 GETNUMKEYS=1");

  server->allow(*AdmissionRule::address("127.0.0.1"));
  expectServing();
  EXPECT_EQ(server->stats().rejected, 3u);
}

// The control plane's connections pass the same rule before the first byte is looked at.
TEST_F(StoreServerTest, AnHttp2PeerNotAdmittedNeverReachesTheForeignServer) {
  std::atomic<int> handedOver{0};
  startAdmittingOnly127002([&](int fd) {
    ++handedOver;
    ::close(fd);
  });
  SourcedClient stranger("127.0.0.1", server->port());
  stranger.send("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
  stranger.read(1);  // EOF or a reset: the preface arrived unread
  EXPECT_TRUE(testing::eventually([&] { return server->stats().rejected == 1; }));
  SourcedClient node("127.0.0.2", server->port());
  node.send("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
  EXPECT_TRUE(testing::eventually([&] { return handedOver == 1; }));
  EXPECT_EQ(server->stats().foreign, 1u);
}

}  // namespace
}  // namespace dlrun::rendezvous
