// Attempts' key spaces (wire.h's SPACE_OPEN, SPACE_CLOSE): each attempt's workers reach a port
// of their own whose keys no other attempt sees, the group's newest attempt wins, and a closed
// space's port, connections and keys are gone.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>

#include "common/error.h"
#include "store/store_server.h"
#include "store/tcp_store.h"
#include "tests/store_test_util.h"

namespace dlrun {
namespace {

using testing::eventually;
using testing::RawClient;
using wire::Encoder;
using wire::Era;
using wire::Op;

class StoreSpacesTest : public ::testing::Test {
 protected:
  TcpStore client(uint16_t port) {
    return TcpStore({.at = {"127.0.0.1", port},
                     .timeout = std::chrono::seconds(5),
                     .connectTimeout = std::chrono::milliseconds(200),
                     .reconnect = false});
  }
  TcpStore store() { return client(server->port()); }

  // Whether a connection to `port` opens and is served (a PING answered).
  bool serves(uint16_t port) {
    try {
      client(port).ping();
      return true;
    } catch (const Error&) {
      return false;
    }
  }

  std::unique_ptr<StoreServerThread> server =
      std::make_unique<StoreServerThread>(StoreServerOptions{.listen = {"127.0.0.1", 0}});
};

TEST_F(StoreSpacesTest, AnAttemptsKeysAreItsOwnAndNotTheStores) {
  auto rendezvous = store();
  rendezvous.set("/job/key", "the store's");
  const uint16_t port = rendezvous.openSpace("job", 0);
  ASSERT_NE(port, 0);
  EXPECT_NE(port, server->port());
  auto worker = client(port);
  EXPECT_FALSE(worker.check({"/job/key"}));
  worker.set("/rank_0", "10.0.0.1:5000");
  EXPECT_EQ(worker.numKeys(), 1);
  EXPECT_FALSE(rendezvous.check({"/rank_0"}));
  EXPECT_EQ(client(port).get("/rank_0"), "10.0.0.1:5000");  // every connection to the port
  EXPECT_TRUE(eventually([&] { return server->stats().keys == 2 && server->stats().spaces == 1; }));
}

TEST_F(StoreSpacesTest, TheNextAttemptStartsEmptyAndTheLastOnesKeysAndConnectionsGo) {
  auto rendezvous = store();
  const uint16_t first = rendezvous.openSpace("job", 0);
  auto dead = client(first);
  dead.set("/rank_0", "an address of the dead attempt");
  const uint16_t second = rendezvous.openSpace("job", 1);
  ASSERT_NE(second, 0);
  EXPECT_NE(second, first);
  EXPECT_FALSE(client(second).check({"/rank_0"}));
  EXPECT_THROW(dead.get("/rank_0"), Error);  // its connection was closed with its space
  EXPECT_FALSE(serves(first));
  EXPECT_TRUE(eventually([&] { return server->stats().keys == 0 && server->stats().spaces == 1; }));
}

TEST_F(StoreSpacesTest, EveryNodeOfAnAttemptGetsTheSamePortAndALateOneNone) {
  auto a = store(), b = store();
  const uint16_t port = a.openSpace("job", 3);
  EXPECT_EQ(b.openSpace("job", 3), port);
  EXPECT_EQ(b.openSpace("job", 2), 0);  // a node still in an earlier round: it is over
  EXPECT_TRUE(serves(port));            // and the newest stays open
  EXPECT_NE(b.openSpace("other job", 2), 0);
  EXPECT_TRUE(eventually([&] { return server->stats().spaces == 2; }));
}

TEST_F(StoreSpacesTest, AClosedSpaceGoesWithItsLastConnection) {
  auto rendezvous = store();
  const uint16_t port = rendezvous.openSpace("job", 0);
  auto stopping = client(port);
  stopping.set("/k", "v");
  rendezvous.closeSpace("job");
  EXPECT_FALSE(serves(port));                    // no new connection
  EXPECT_EQ(stopping.get("/k"), "v");            // a worker still stopping is still served
  EXPECT_EQ(rendezvous.openSpace("job", 0), 0);  // and its attempt is over
  EXPECT_EQ(server->stats().spaces, 1u);
  stopping.abort();
  EXPECT_TRUE(eventually([&] { return server->stats().spaces == 0 && server->stats().keys == 0; }));
  EXPECT_NE(rendezvous.openSpace("job", 1), 0);
}

TEST_F(StoreSpacesTest, AWaitOfAnAttemptThatEndsIsCutNotLeftBehind) {
  auto rendezvous = store();
  const uint16_t first = rendezvous.openSpace("job", 0);
  RawClient waiter(first);
  waiter.validate();
  std::string wait;
  Encoder(wait).op(Era::V2, Op::Wait).u64(1).bytes("/never");
  waiter.send(wait);
  ASSERT_TRUE(eventually([&] { return server->stats().waiters == 1; }));
  rendezvous.openSpace("job", 1);
  EXPECT_TRUE(waiter.closedByServer());
  EXPECT_TRUE(eventually([&] { return server->stats().waiters == 0; }));
}

TEST_F(StoreSpacesTest, LeasesAndSpacesAreRefusedOnAnAttemptsPort) {
  const uint16_t port = store().openSpace("job", 0);
  for (const Op op : {Op::Lease, Op::SpaceOpen, Op::SpaceClose}) {
    RawClient c(port);
    c.validate();
    std::string request;
    Encoder e(request);
    e.op(Era::V2, op).bytes("job");
    if (op == Op::Lease) e.bytes("v").u64(1000).u64(0);
    if (op == Op::SpaceOpen) e.i64(1);
    c.send(request);
    EXPECT_TRUE(c.closedByServer()) << wire::opName(op);
  }
  EXPECT_TRUE(serves(port));
  EXPECT_EQ(store().openSpace("job", 0), port);
}

TEST_F(StoreSpacesTest, ATwentyAttemptJobLeavesOneSpaceOfItsLastAttemptsKeys) {
  auto rendezvous = store();
  for (int attempt = 0; attempt < 20; ++attempt) {
    const uint16_t port = rendezvous.openSpace("job", attempt);
    auto worker = client(port);
    EXPECT_FALSE(worker.check({"/attempt_" + std::to_string(attempt - 1)}));
    for (int key = 0; key < 50; ++key) worker.set("/k" + std::to_string(key), "v");
    worker.set("/attempt_" + std::to_string(attempt), "here");
    EXPECT_EQ(worker.numKeys(), 51);
  }
  EXPECT_TRUE(
      eventually([&] { return server->stats().keys == 51 && server->stats().spaces == 1; }));
}

TEST_F(StoreSpacesTest, StoppingTheServerClosesItsSpaces) {
  const uint16_t port = store().openSpace("job", 0);
  auto worker = client(port);
  worker.set("/k", "v");
  server.reset();
  EXPECT_FALSE(serves(port));
  EXPECT_THROW(worker.get("/k"), Error);
}

// The control plane's HTTP/2 on an attempt's port is handed over as on the store's own; the
// connection handed over is no longer the space's, so the space can end and the server stop.
TEST_F(StoreSpacesTest, AnHttp2ConnectionToAnAttemptsPortGoesToTheForeignServer) {
  std::atomic<int> handed{0};
  server = std::make_unique<StoreServerThread>(
      StoreServerOptions{.listen = {"127.0.0.1", 0}, .foreign = [&](int fd) {
                           ++handed;
                           ::close(fd);
                         }});
  auto rendezvous = store();
  const uint16_t port = rendezvous.openSpace("job", 0);
  RawClient grpc(port);
  grpc.send("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
  EXPECT_TRUE(grpc.closedByServer());
  EXPECT_EQ(handed.load(), 1);
  rendezvous.closeSpace("job");
  EXPECT_TRUE(eventually([&] { return server->stats().spaces == 0; }));
  rendezvous.openSpace("job", 1);
  RawClient another(rendezvous.openSpace("job", 1));
  another.send("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
  EXPECT_TRUE(another.closedByServer());
  server.reset();  // returns: the space handed over holds nothing up
}

}  // namespace
}  // namespace dlrun
