#include "trainer/ps_engine.h"

#include <signal.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "common/asio.h"
#include "common/error.h"
#include "common/log.h"
#include "common/text.h"
#include "trainer/math_dispatch.h"
#include "trainer/model_factory.h"
#include "trainer/ps_server.h"

namespace dlrun::trainer {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;

// A lost server ends the attempt: dlrun sees its exit and stops every worker, and the job
// resumes from the chief's checkpoint. Until that SIGTERM comes (at once, unlike the training
// loop's, which waits for a step's end) the worker waits, so its own exit cannot be taken for
// the first failure (and, for a worker restarted alone, cost a restart).
[[noreturn]] void lostServer(int index, const std::string& why) {
  ::signal(SIGTERM, SIG_DFL);
  log::info("lost parameter server " + std::to_string(index) + " (" + why +
            "); waiting for dlrun to end the attempt");
  std::this_thread::sleep_for(std::chrono::seconds(60));
  throw Error("lost parameter server " + std::to_string(index) + ": " + why);
}

class CpuPsEngine final : public PsEngine {
 public:
  CpuPsEngine(const EngineOptions& options, const PsPlace& place, Store& store)
      : model_(makeModel(options.model, options.seed, cpuMath(options.cpuMath))),
        place_(place),
        ranges_(shardRanges(model_->params().size(), place.servers)),
        grads_(model_->params().size()) {
    for (int i = 0; i < place.servers; ++i) {
      const std::string value = store.get(psAddressKey(i));
      const size_t space = value.find(' ');
      tcp::socket socket(io_);
      try {
        const auto port = parseInteger<uint16_t>(std::string_view(value).substr(space + 1));
        if (!port) throw ProtocolError("no port after the address");
        socket.connect({asio::ip::make_address(value.substr(0, space)), *port});
      } catch (const std::exception& e) {
        throw NetworkError("cannot reach parameter server " + std::to_string(i) + " at " + value +
                           ": " + e.what());
      }
      socket.set_option(tcp::no_delay(true));
      servers_.push_back(std::move(socket));
    }
  }

  void setPosition(const ps::Position& after) override { position_ = after; }

  ps::Position join(const std::optional<Checkpoint>& init) override {
    if (init) {
      for (int i = 0; i < place_.servers; ++i) {
        const ShardRange r = ranges_[i];
        const ps::Position at{init->epoch, init->samplesInEpoch, init->globalStep};
        send(i, ps::Op::Init,
             {{&at, sizeof(at)},
              {init->params.data() + r.begin, r.size() * sizeof(float)},
              {init->velocity.data() + r.begin, r.size() * sizeof(float)}});
      }
      for (int i = 0; i < place_.servers; ++i) receive(i, {});
    }
    ps::Position at;
    for (int i = 0; i < place_.servers; ++i) send(i, ps::Op::Hello, {});
    for (int i = 0; i < place_.servers; ++i)
      receive(i, {{&at, sizeof(at)}, shardOf(model_->params(), i)});
    return at;
  }

  StepResult step(const float* x, const uint8_t* labels, int batch, float learningRate,
                  bool stopVote) override {
    const float loss = model_->lossAndGradient(x, labels, batch, grads_.data());
    for (int i = 0; i < place_.servers; ++i)
      send(i, ps::Op::Push,
           {{&learningRate, sizeof(learningRate)},
            {&position_, sizeof(position_)},
            shardOf(grads_, i)});
    for (int i = 0; i < place_.servers; ++i) receive(i, {shardOf(model_->params(), i)});
    return {loss, stopVote};
  }

  int countCorrect(const float* x, const uint8_t* labels, int batch) override {
    return model_->countCorrect(x, labels, batch);
  }

  std::vector<float> params() const override { return model_->params(); }

  // The servers' momentum (the chief checkpoints it with the parameters it pulled last).
  std::vector<float> velocity() const override {
    std::vector<float> velocity(model_->params().size()), params(velocity.size());
    for (int i = 0; i < place_.servers; ++i) send(i, ps::Op::State, {});
    for (int i = 0; i < place_.servers; ++i) receive(i, {shardOf(params, i), shardOf(velocity, i)});
    return velocity;
  }

  void load(const std::vector<float>& params, const std::vector<float>& velocity) override {
    join(Checkpoint{.params = params, .velocity = velocity});
  }

  void done() override {
    for (int i = 0; i < place_.servers; ++i) send(i, ps::Op::Done, {});
    for (int i = 0; i < place_.servers; ++i) receive(i, {});
  }

  const char* device() const override { return "cpu"; }

 private:
  using Part = std::pair<void*, size_t>;

  Part shardOf(std::vector<float>& v, int i) const {
    return {v.data() + ranges_[i].begin, ranges_[i].size() * sizeof(float)};
  }

  // const: a request changes no model state (velocity() asks the servers for theirs).
  void send(int i, ps::Op op, std::initializer_list<std::pair<const void*, size_t>> parts) const {
    ps::Header header{static_cast<uint32_t>(op), static_cast<uint32_t>(place_.index), 0};
    std::vector<asio::const_buffer> buffers{asio::buffer(&header, sizeof(header))};
    for (const auto& [data, bytes] : parts) {
      header.bytes += bytes;
      buffers.push_back(asio::buffer(data, bytes));
    }
    boost::system::error_code ec;
    asio::write(servers_[i], buffers, ec);
    if (ec) lostServer(i, ec.message());
  }

  void receive(int i, std::initializer_list<Part> parts) const {
    ps::Header header;
    std::vector<asio::mutable_buffer> buffers;
    size_t bytes = 0;
    for (const auto& [data, size] : parts) {
      buffers.push_back(asio::buffer(data, size));
      bytes += size;
    }
    boost::system::error_code ec;
    asio::read(servers_[i], asio::buffer(&header, sizeof(header)), ec);
    if (!ec && header.bytes != bytes) lostServer(i, "a reply of the wrong size");
    if (!ec) asio::read(servers_[i], buffers, ec);
    if (ec) lostServer(i, ec == asio::error::eof ? "it closed the connection" : ec.message());
  }

  std::unique_ptr<Model> model_;
  const PsPlace place_;
  const std::vector<ShardRange> ranges_;
  std::vector<float> grads_;
  asio::io_context io_;  // the sockets' context; every call on them blocks
  mutable std::vector<tcp::socket> servers_;
  ps::Position position_;
};

}  // namespace

std::unique_ptr<PsEngine> makePsEngine(const EngineOptions& options, const PsPlace& place,
                                       Store& store) {
  return std::make_unique<CpuPsEngine>(options, place, store);
}

}  // namespace dlrun::trainer
