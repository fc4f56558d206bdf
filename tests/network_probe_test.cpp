// The network probe between a round's nodes (agents/network_probe.h): its measure on the wire
// between agents, what a round's links say, and a probe's bounds (a peer refusing, a peer
// silent, a peer that is not a probe's, a length past the limit).
#include "agents/network_probe.h"

#include <gtest/gtest.h>

#include <thread>

#include "common/error.h"
#include "common/host_port.h"

namespace dlrun::agents {
namespace {

using namespace std::chrono_literals;
using tcp = asio::ip::tcp;

auto in(std::chrono::milliseconds ms) { return std::chrono::steady_clock::now() + ms; }

// A ProbeServer served by a loop of the test's own.
class Served : public ::testing::Test {
 protected:
  void SetUp() override {
    server_.emplace(io_, "127.0.0.1");
    loop_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    asio::post(io_, [this] { server_.reset(); });
    work_.reset();
    io_.stop();
    loop_.join();
  }
  std::string address() const { return server_->address(); }

  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_{io_.get_executor()};
  std::optional<ProbeServer> server_;
  std::thread loop_;
};

TEST_F(Served, ALinkIsMeasured) {
  const LinkMeasure m = probeLink("a", "b", address(), 1 << 20, in(10s));
  ASSERT_EQ(m.problem, std::nullopt);
  EXPECT_EQ(m.from, "a");
  EXPECT_EQ(m.to, "b");
  EXPECT_GT(m.roundTripMs, 0);
  EXPECT_GT(m.megabytesPerSecond, 0);
  EXPECT_GT(m.sendSeconds, 0);
  EXPECT_LT(std::abs(m.clockAheadMs), 100) << "one machine, one clock";
}

TEST_F(Served, ALengthPastTheLimitIsRefused) {
  const LinkMeasure m = probeLink("a", "b", address(), kProbeMaxBytes + 1, in(10s));
  ASSERT_TRUE(m.problem);
  EXPECT_NE(m.problem->find("sending"), std::string::npos) << *m.problem;
}

TEST_F(Served, BytesThatAreNotAProbesEndTheConnection) {
  asio::io_context io;
  tcp::socket socket(io);
  socket.connect(
      tcp::endpoint(asio::ip::make_address("127.0.0.1"), parseHostPort(address(), 0).port));
  asio::write(socket, asio::buffer("GET / HTTP/1.1\r\n\r\n", 18));
  char byte = 0;
  boost::system::error_code ec;
  asio::read(socket, asio::buffer(&byte, 1), ec);
  // Closed with the rest unread: an end of file, or a reset.
  EXPECT_TRUE(ec == asio::error::eof || ec == asio::error::connection_reset) << ec.message();
}

TEST(NetworkProbe, APeerThatRefusesIsNamed) {
  asio::io_context io;
  tcp::acceptor closed(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const uint16_t port = closed.local_endpoint().port();
  closed.close();
  const LinkMeasure m = probeLink("a", "b", "127.0.0.1:" + std::to_string(port), 1024, in(5s));
  ASSERT_TRUE(m.problem);
  EXPECT_NE(m.problem->find("connect"), std::string::npos) << *m.problem;
}

TEST(NetworkProbe, ASilentPeerIsBoundedByTheDeadline) {
  asio::io_context io;
  tcp::acceptor silent(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
  const auto port = silent.local_endpoint().port();  // its backlog accepts; nothing answers
  const auto start = std::chrono::steady_clock::now();
  const LinkMeasure m = probeLink("a", "b", "127.0.0.1:" + std::to_string(port), 1024, in(300ms));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  ASSERT_TRUE(m.problem);
  EXPECT_EQ(*m.problem, "ping did not finish in time");
}

TEST(NetworkProbe, AMeasureCrossesTheRoundAsText) {
  LinkMeasure m{.from = "node1 (10.0.0.1)",
                .to = "node2",
                .roundTripMs = 0.25,
                .megabytesPerSecond = 812.5,
                .sendSeconds = 0.005,
                .clockAheadMs = -3,
                .storeMs = 0.7};
  const LinkMeasure back = LinkMeasure::decode(m.encode());
  EXPECT_EQ(back.from, m.from);
  EXPECT_EQ(back.to, m.to);
  EXPECT_EQ(back.problem, std::nullopt);
  EXPECT_DOUBLE_EQ(back.megabytesPerSecond, 812.5);
  EXPECT_DOUBLE_EQ(back.clockAheadMs, -3);
  EXPECT_DOUBLE_EQ(back.storeMs, 0.7);
  m.problem = "connect: Connection refused";
  EXPECT_EQ(LinkMeasure::decode(m.encode()).problem, m.problem);
  EXPECT_THROW(LinkMeasure::decode("{\"from\": 3}"), NetworkError);
  EXPECT_THROW(LinkMeasure::decode("not json"), NetworkError);
}

LinkMeasure link(std::string from, std::string to, double mbs, double seconds) {
  return {.from = std::move(from),
          .to = std::move(to),
          .roundTripMs = 0.1,
          .megabytesPerSecond = mbs,
          .sendSeconds = seconds};
}

TEST(NetworkProbe, TheSlowestLinkIsNamedAgainstTheMedian) {
  const auto lines = describeLinks({link("n0", "n1", 900, 0.005), link("n1", "n2", 2.5, 1.6),
                                    link("n2", "n3", 800, 0.006), link("n3", "n0", 1000, 0.004)});
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "network probe: slowest link n1 -> n2: 2.5 MB/s, 0.10 ms round trip (the median of "
            "4 links: 850.0 MB/s, 0.10 ms)");
}

TEST(NetworkProbe, LinksNotMeasuredAndClocksApartAreNamed) {
  LinkMeasure refused{.from = "n1", .to = "n2", .problem = "connect: Connection refused"};
  LinkMeasure ahead = link("n0", "n1", 900, 0.005);
  ahead.clockAheadMs = 3200;
  LinkMeasure behind = link("n2", "n0", 900, 0.005);
  behind.clockAheadMs = -400;  // within the limit
  ahead.storeMs = refused.storeMs = 0.5;
  behind.storeMs = 1500;
  const auto lines = describeLinks({ahead, refused, behind});
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0],
            "network probe: n2 took 1.50 s to reach the store (one request; the median 0.5 "
            "ms)");
  EXPECT_EQ(lines[1], "network probe: n1 -> n2 not measured: connect: Connection refused");
  EXPECT_EQ(lines[3], "network probe: n1's clock is 3.20 s ahead of n0's");
  EXPECT_TRUE(describeLinks({}).empty());
}

}  // namespace
}  // namespace dlrun::agents
