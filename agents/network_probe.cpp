#include "agents/network_probe.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/host_port.h"
#include "common/log.h"

namespace dlrun::agents {

namespace {

using boost::system::error_code;
using tcp = asio::ip::tcp;
using SteadyTime = std::chrono::steady_clock::time_point;

// A connection that stays silent this long is dropped (a prober gone half-way).
constexpr std::chrono::seconds kIdleLimit{10};
constexpr size_t kChunk = 64 << 10;

int64_t wallNanoseconds() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

std::string fixed(double value, int digits) {
  char text[48];
  std::snprintf(text, sizeof text, "%.*f", digits, value);
  return text;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// One prober's connection: answers its pings and its data until it closes or stays silent.
class Session : public std::enable_shared_from_this<Session> {
 public:
  explicit Session(tcp::socket socket)
      : socket_(std::move(socket)), idle_(socket_.get_executor()) {}

  void start() { readCommand(); }

 private:
  void stop() { idle_.cancel(); }  // the session ends once its last handler is gone

  void arm() {
    idle_.expires_after(kIdleLimit);
    idle_.async_wait([self = shared_from_this()](const error_code& ec) {
      if (!ec) self->socket_.close();
    });
  }

  void readCommand() {
    arm();
    asio::async_read(socket_, asio::buffer(head_.data(), 1),
                     [self = shared_from_this()](const error_code& ec, size_t) {
                       if (ec) return self->stop();
                       if (self->head_[0] == 'T') return self->answerPing();
                       if (self->head_[0] == 'D') return self->readLength();
                       self->socket_.close();  // not a prober: nothing more to say to it
                       self->stop();
                     });
  }

  void answerPing() {
    head_[0] = 'T';
    uint64_t now = static_cast<uint64_t>(wallNanoseconds());
    for (int i = 8; i >= 1; --i, now >>= 8) head_[i] = static_cast<char>(now & 0xff);
    asio::async_write(socket_, asio::buffer(head_.data(), 9),
                      [self = shared_from_this()](const error_code& ec, size_t) {
                        if (ec) return self->stop();
                        self->readCommand();
                      });
  }

  void readLength() {
    asio::async_read(socket_, asio::buffer(head_.data(), 4),
                     [self = shared_from_this()](const error_code& ec, size_t) {
                       if (ec) return self->stop();
                       uint32_t length = 0;
                       for (int i = 0; i < 4; ++i)
                         length = length << 8 | static_cast<unsigned char>(self->head_[i]);
                       if (length > kProbeMaxBytes) {
                         self->socket_.close();
                         return self->stop();
                       }
                       self->left_ = length;
                       self->readData();
                     });
  }

  void readData() {
    if (left_ == 0) {
      head_[0] = 'A';
      return asio::async_write(socket_, asio::buffer(head_.data(), 1),
                               [self = shared_from_this()](const error_code& ec, size_t) {
                                 if (ec) return self->stop();
                                 self->readCommand();
                               });
    }
    arm();
    data_.resize(kChunk);
    socket_.async_read_some(asio::buffer(data_.data(), std::min<size_t>(left_, kChunk)),
                            [self = shared_from_this()](const error_code& ec, size_t n) {
                              if (ec) return self->stop();
                              self->left_ -= n;
                              self->readData();
                            });
  }

  tcp::socket socket_;
  asio::steady_timer idle_;
  std::array<char, 9> head_{};
  std::vector<char> data_;
  size_t left_ = 0;
};

// The prober's side: each step bounded by the one deadline, on an io_context of its own (the
// caller's thread blocks: the agent probes from its rendezvous thread).
class Prober {
 public:
  Prober(const HostPort& at, SteadyTime deadline) : deadline_(deadline) {
    tcp::resolver resolver(io_);
    error_code ec;
    const auto endpoints = resolver.resolve(at.host, std::to_string(at.port), ec);
    if (ec) throw NetworkError("cannot resolve " + at.host + ": " + ec.message());
    await("connect", [&](auto done) { asio::async_connect(socket_, endpoints, done); });
    socket_.set_option(tcp::no_delay(true));
  }

  // A ping's round trip and the peer's wall clock less this node's at its middle.
  std::pair<double, double> ping() {
    std::array<char, 9> answer{};
    const int64_t sentWall = wallNanoseconds();
    const auto sent = std::chrono::steady_clock::now();
    await("ping", [&](auto done) { asio::async_write(socket_, asio::buffer("T", 1), done); });
    await("ping", [&](auto done) { asio::async_read(socket_, asio::buffer(answer), done); });
    const double roundTrip = seconds(std::chrono::steady_clock::now() - sent);
    if (answer[0] != 'T') throw NetworkError("the peer's answer is not a probe's");
    uint64_t peerWall = 0;
    for (int i = 1; i <= 8; ++i) peerWall = peerWall << 8 | static_cast<unsigned char>(answer[i]);
    const double middle = static_cast<double>(sentWall) + roundTrip * 1e9 / 2;
    return {roundTrip, (static_cast<double>(static_cast<int64_t>(peerWall)) - middle) / 1e6};
  }

  // Seconds to move `bytes`, acknowledged.
  double send(uint32_t bytes) {
    std::vector<char> data(5 + static_cast<size_t>(bytes));
    data[0] = 'D';
    for (int i = 0; i < 4; ++i) data[1 + i] = static_cast<char>(bytes >> (24 - 8 * i) & 0xff);
    char ack = 0;
    const auto start = std::chrono::steady_clock::now();
    await("sending", [&](auto done) { asio::async_write(socket_, asio::buffer(data), done); });
    await("sending", [&](auto done) { asio::async_read(socket_, asio::buffer(&ack, 1), done); });
    if (ack != 'A') throw NetworkError("the peer's answer is not a probe's");
    return seconds(std::chrono::steady_clock::now() - start);
  }

 private:
  template <typename Start>
  void await(const std::string& what, Start start) {
    std::optional<error_code> result;
    start([&result](const error_code& ec, auto&&...) { result = ec; });
    io_.restart();
    io_.run_until(deadline_);
    if (!result) throw NetworkError(what + " did not finish in time");
    if (*result) throw NetworkError(what + ": " + result->message());
  }

  asio::io_context io_;
  tcp::socket socket_{io_};
  SteadyTime deadline_;
};

}  // namespace

std::string LinkMeasure::encode() const {
  nlohmann::json j{{"from", from},          {"to", to},
                   {"rtt_ms", roundTripMs}, {"mb_s", megabytesPerSecond},
                   {"send_s", sendSeconds}, {"clock_ahead_ms", clockAheadMs},
                   {"store_ms", storeMs}};
  if (problem) j["problem"] = *problem;
  return j.dump();
}

LinkMeasure LinkMeasure::decode(const std::string& text) {
  try {
    const auto j = nlohmann::json::parse(text);
    LinkMeasure m{.from = j.at("from"),
                  .to = j.at("to"),
                  .roundTripMs = j.at("rtt_ms"),
                  .megabytesPerSecond = j.at("mb_s"),
                  .sendSeconds = j.at("send_s"),
                  .clockAheadMs = j.at("clock_ahead_ms"),
                  .storeMs = j.at("store_ms")};
    if (j.contains("problem")) m.problem = j.at("problem").get<std::string>();
    return m;
  } catch (const nlohmann::json::exception& e) {
    throw NetworkError(std::string("a network probe's measure that cannot be read: ") + e.what());
  }
}

std::vector<std::string> describeLinks(const std::vector<LinkMeasure>& links) {
  std::vector<std::string> lines;
  std::vector<double> storeTimes;
  for (const auto& link : links) storeTimes.push_back(link.storeMs);
  for (const auto& link : links)
    if (link.storeMs > static_cast<double>(kStoreSlowLimit.count()))
      lines.push_back("network probe: " + link.from + " took " + fixed(link.storeMs / 1000, 2) +
                      " s to reach the store (one request; the median " +
                      fixed(median(storeTimes), 1) + " ms)");
  std::vector<const LinkMeasure*> measured;
  for (const auto& link : links) {
    if (link.problem)
      lines.push_back("network probe: " + link.from + " -> " + link.to +
                      " not measured: " + *link.problem);
    else
      measured.push_back(&link);
  }
  if (measured.empty()) return lines;
  const auto* slowest = *std::max_element(measured.begin(), measured.end(), [](auto* a, auto* b) {
    return a->sendSeconds < b->sendSeconds;
  });
  std::vector<double> rates, trips;
  for (const auto* link : measured) {
    rates.push_back(link->megabytesPerSecond);
    trips.push_back(link->roundTripMs);
  }
  lines.push_back("network probe: slowest link " + slowest->from + " -> " + slowest->to + ": " +
                  fixed(slowest->megabytesPerSecond, 1) + " MB/s, " +
                  fixed(slowest->roundTripMs, 2) + " ms round trip (the median of " +
                  std::to_string(measured.size()) + " links: " + fixed(median(rates), 1) +
                  " MB/s, " + fixed(median(trips), 2) + " ms)");
  for (const auto* link : measured) {
    if (std::abs(link->clockAheadMs) <= static_cast<double>(kClockSkewLimit.count())) continue;
    lines.push_back("network probe: " + link->to + "'s clock is " +
                    fixed(std::abs(link->clockAheadMs) / 1000, 2) + " s " +
                    (link->clockAheadMs > 0 ? "ahead of " : "behind ") + link->from + "'s");
  }
  return lines;
}

struct ProbeServer::Impl : std::enable_shared_from_this<Impl> {
  explicit Impl(asio::io_context& io) : acceptor(io) {}

  void accept() {
    acceptor.async_accept([self = shared_from_this()](const error_code& ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
      if (!ec) std::make_shared<Session>(std::move(socket))->start();
      self->accept();
    });
  }

  tcp::acceptor acceptor;
  std::string host;
};

ProbeServer::ProbeServer(asio::io_context& io, const std::string& host)
    : impl_(std::make_shared<Impl>(io)) {
  error_code ec;
  tcp::resolver resolver(io);
  const auto found = resolver.resolve(host, "0", ec);
  if (ec || found.empty())
    throw NetworkError("the network probe cannot listen on " + host + ": " + ec.message());
  const tcp::endpoint at = found.begin()->endpoint();
  impl_->acceptor.open(at.protocol(), ec);
  if (!ec) impl_->acceptor.bind(at, ec);
  if (!ec) impl_->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw NetworkError("the network probe cannot listen on " + host + ": " + ec.message());
  impl_->host = host;
  impl_->accept();
}

ProbeServer::~ProbeServer() {
  error_code ignored;
  impl_->acceptor.close(ignored);
}

std::string ProbeServer::address() const {
  return joinHostPort(impl_->host, impl_->acceptor.local_endpoint().port());
}

LinkMeasure probeLink(const std::string& from, const std::string& to, const std::string& address,
                      uint32_t bytes, std::chrono::steady_clock::time_point deadline) {
  LinkMeasure measure{.from = from, .to = to};
  try {
    Prober prober(parseHostPort(address, 0), deadline);
    std::vector<std::pair<double, double>> pings;
    for (int i = 0; i < kProbePings; ++i) pings.push_back(prober.ping());
    std::vector<double> trips;
    for (const auto& ping : pings) trips.push_back(ping.first);
    measure.roundTripMs = median(trips) * 1000;
    measure.clockAheadMs = std::min_element(pings.begin(), pings.end())->second;
    measure.sendSeconds = prober.send(bytes);
    const double moving = std::max(measure.sendSeconds - measure.roundTripMs / 1000, 1e-6);
    measure.megabytesPerSecond = bytes / moving / 1e6;
  } catch (const Error& e) {
    measure.problem = e.what();
  }
  return measure;
}

}  // namespace dlrun::agents
