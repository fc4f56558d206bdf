// One io_context on the process's only thread: a server has nothing else to do, so it blocks
// in run() until every worker is done. One session per worker connection, each reading a
// request, answering it (or, under --ps-sync, parking it until the step's last push), then
// reading the next.
#include "trainer/ps_server.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <set>

#include "common/asio.h"
#include "common/host_port.h"
#include "common/listen.h"
#include "common/log.h"
#include "store/address.h"
#include "trainer/job_data.h"
#include "trainer/math_dispatch.h"
#include "trainer/model.h"
#include "trainer/ps_wire.h"

namespace dlrun::trainer {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

class Server {
 public:
  Server(const TrainConfig& config, const PsPlace& place, size_t parameters)
      : place_(place),
        sync_(config.psSync),
        params_(parameters),
        sgd_({config.learningRate, config.momentum, config.weightDecay}, parameters,
             cpuMath(config.cpuMath)),
        acceptor_(io_),
        pending_(place.workers),
        positions_(place.workers) {}

  uint16_t listen(const std::string& address) {
    acceptor_ = listenOn(io_, {asio::ip::make_address(address), 0},
                         "the parameter server's address " + address);
    accept();
    return acceptor_.local_endpoint().port();
  }

  void run() { io_.run(); }
  uint64_t sent() const { return sent_; }
  uint64_t received() const { return received_; }
  int64_t pushes() const { return pushes_; }

 private:
  struct Session {
    explicit Session(asio::io_context& io) : socket(io) {}
    tcp::socket socket;
    ps::Header header;
    std::vector<char> body, reply;
  };
  using SessionPtr = std::shared_ptr<Session>;

  size_t shard() const { return params_.size(); }
  size_t floats(size_t n) const { return n * sizeof(float); }

  void accept() {
    auto session = std::make_shared<Session>(io_);
    acceptor_.async_accept(session->socket, [this, session](boost::system::error_code ec) {
      if (ec) return;
      session->socket.set_option(tcp::no_delay(true));
      read(session);
      accept();
    });
  }

  // The payload each request must carry; anything else is a broken peer, disconnected.
  std::optional<size_t> expected(const ps::Header& h) const {
    if (h.worker >= static_cast<uint32_t>(place_.workers)) return std::nullopt;
    switch (static_cast<ps::Op>(h.op)) {
      case ps::Op::Init: return sizeof(ps::Position) + 2 * floats(shard());
      case ps::Op::Push: return sizeof(float) + sizeof(ps::Position) + floats(shard());
      case ps::Op::Hello:
      case ps::Op::State:
      case ps::Op::Done: return 0;
    }
    return std::nullopt;
  }

  void read(const SessionPtr& s) {
    asio::async_read(s->socket, asio::buffer(&s->header, sizeof(s->header)),
                     [this, s](boost::system::error_code ec, size_t) {
                       if (ec) return forget(s);
                       const auto bytes = expected(s->header);
                       if (!bytes || *bytes != s->header.bytes) {
                         log::info("parameter server: a malformed request; disconnected");
                         return forget(s);
                       }
                       s->body.resize(*bytes);
                       asio::async_read(s->socket, asio::buffer(s->body),
                                        [this, s](boost::system::error_code ec2, size_t) {
                                          if (ec2) return forget(s);
                                          received_ += sizeof(ps::Header) + s->body.size();
                                          handle(s);
                                        });
                     });
  }

  // A worker gone (killed: it will be restarted alone) leaves no parked push behind.
  void forget(const SessionPtr& s) {
    for (auto& parked : pending_)
      if (parked == s) parked.reset();
    std::erase(hellos_, s);
  }

  void handle(const SessionPtr& s) {
    const int worker = static_cast<int>(s->header.worker);
    const char* at = s->body.data();
    switch (static_cast<ps::Op>(s->header.op)) {
      case ps::Op::Init:
        if (!initialized_) {
          ps::Position position;
          std::memcpy(&position, at, sizeof(position));
          std::fill(positions_.begin(), positions_.end(), position);
          std::memcpy(params_.data(), at + sizeof(position), floats(shard()));
          std::memcpy(sgd_.velocity().data(), at + sizeof(position) + floats(shard()),
                      floats(shard()));
          initialized_ = true;
          for (const auto& waiting : hellos_) replyHello(waiting);
          hellos_.clear();
        }
        return reply(s, {});
      case ps::Op::Hello:
        if (!initialized_) return hellos_.push_back(s);
        return replyHello(s);
      case ps::Op::Push: {
        float lr;
        std::memcpy(&lr, at, sizeof(lr));
        std::memcpy(&positions_[worker], at + sizeof(lr), sizeof(ps::Position));
        ++pushes_;
        sgd_.setLearningRate(lr);
        if (!sync_) {
          const auto* grads =
              reinterpret_cast<const float*>(at + sizeof(lr) + sizeof(ps::Position));
          sgd_.step(params_, grads, 1.0f / static_cast<float>(place_.workers));
          return replyPredicted(s, lr);
        }
        pending_[worker] = s;
        for (const auto& parked : pending_)
          if (!parked) return;
        return applySyncStep();
      }
      case ps::Op::State:
        return reply(
            s, {{params_.data(), floats(shard())}, {sgd_.velocity().data(), floats(shard())}});
      case ps::Op::Done: done_.insert(worker); return reply(s, {});
    }
  }

  // Every worker's push of the step is in: the mean of their sum, in worker order, as the
  // all-reduce computes it, then one reply to each.
  void applySyncStep() {
    sum_.assign(shard(), 0.0f);
    for (const auto& parked : pending_) {
      const auto* grads = reinterpret_cast<const float*>(parked->body.data() + sizeof(float) +
                                                         sizeof(ps::Position));
      for (size_t i = 0; i < shard(); ++i) sum_[i] += grads[i];
    }
    sgd_.step(params_, sum_.data(), 1.0f / static_cast<float>(place_.workers));
    for (auto& parked : pending_)
      reply(std::exchange(parked, nullptr), {{params_.data(), floats(shard())}});
  }

  // Async: the worker's next gradient is applied after the other workers' pushes in between
  // (one each on average: its staleness), and computed where the parameters were before them,
  // which under momentum is far off (3 epochs, 1 ps, 2 workers: 0.858-0.861 against --ps-sync's
  // 0.871). So it gets the parameters predicted for then, each push moving them by about
  // lr x velocity (weight prediction, as in SpecTrain: Chen et al., 2018); that gives
  // 0.865-0.870. Its evaluation and checkpoint take that point of the trajectory too.
  // Written straight into the reply: a copy of the shard less on every push.
  void replyPredicted(const SessionPtr& s, float lr) {
    const float ahead =
        lr * static_cast<float>(place_.workers - 1 - static_cast<int>(done_.size()));
    const std::vector<float>& velocity = sgd_.velocity();
    auto* predicted = reinterpret_cast<float*>(replyBody(s, floats(shard())));
    for (size_t i = 0; i < shard(); ++i) predicted[i] = params_[i] - ahead * velocity[i];
    send(s);
  }

  void replyHello(const SessionPtr& s) {
    reply(s, {{&positions_[s->header.worker], sizeof(ps::Position)},
              {params_.data(), floats(shard())}});
  }

  void reply(const SessionPtr& s, std::initializer_list<std::pair<const void*, size_t>> parts) {
    size_t bytes = 0;
    for (const auto& part : parts) bytes += part.second;
    char* at = replyBody(s, bytes);
    for (const auto& [data, size] : parts) {
      std::memcpy(at, data, size);
      at += size;
    }
    send(s);
  }

  // The reply's header written, its body sized; returns where the body goes.
  char* replyBody(const SessionPtr& s, size_t bytes) {
    static_assert(sizeof(ps::Header) % alignof(float) == 0, "floats follow the header");
    ps::Header header = s->header;
    header.bytes = bytes;
    s->reply.resize(sizeof(header) + bytes);
    std::memcpy(s->reply.data(), &header, sizeof(header));
    return s->reply.data() + sizeof(header);
  }

  void send(const SessionPtr& s) {
    sent_ += s->reply.size();
    asio::async_write(s->socket, asio::buffer(s->reply),
                      [this, s](boost::system::error_code ec, size_t) {
                        if (ec) return forget(s);
                        if (done_.size() == static_cast<size_t>(place_.workers)) return io_.stop();
                        read(s);
                      });
  }

  const PsPlace place_;
  const bool sync_;
  std::vector<float> params_, sum_;
  Sgd sgd_;
  asio::io_context io_{1};
  tcp::acceptor acceptor_;
  bool initialized_ = false;
  std::vector<SessionPtr> pending_;      // --ps-sync: each worker's push of the step, parked
  std::vector<SessionPtr> hellos_;       // waiting for the chief's Init
  std::vector<ps::Position> positions_;  // each worker's last
  std::set<int> done_;
  uint64_t sent_ = 0, received_ = 0;
  int64_t pushes_ = 0;
};

}  // namespace

std::string psAddressKey(int index) { return "ps/" + std::to_string(index); }

void servePs(const TrainConfig& config, const Placement& placement, const PsPlace& place,
             const std::function<std::shared_ptr<Store>()>& connect) {
  const Split data = loadData(config);
  const ModelSpec spec = modelSpec(config, data.train);
  const ShardRange range = shardRanges(spec.parameterCount(), place.servers).at(place.index);
  Server server(config, place, range.size());
  const std::string address = localAddressToward(placement.masterAddr, placement.masterPort);
  const uint16_t port = server.listen(address);
  connect()->set(psAddressKey(place.index), address + " " + std::to_string(port));
  log::debug("parameter server " + std::to_string(place.index) + ": parameters [" +
             std::to_string(range.begin) + ", " + std::to_string(range.end) + ") at " +
             joinHostPort(address, port));
  server.run();
  std::printf(
      "{\"strategy\": \"ps\", \"role\": \"ps\", \"index\": %d, \"parameters\": %zu, "
      "\"pushes\": %lld, \"bytes_sent\": %llu, \"bytes_received\": %llu}\n",
      place.index, range.size(), static_cast<long long>(server.pushes()),
      static_cast<unsigned long long>(server.sent()),
      static_cast<unsigned long long>(server.received()));
  std::fflush(stdout);
}

}  // namespace dlrun::trainer
