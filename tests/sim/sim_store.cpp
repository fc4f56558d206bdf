#include "tests/sim/sim_store.h"

#include <algorithm>
#include <type_traits>

#include "common/error.h"
#include "store/tcp_stream.h"
#include "store/wire.h"

namespace dlrun::sim {

using wire::Op;

struct SimStoreServer::Request {
  Op op = Op::Ping;
  std::vector<std::string> keys, values;
  int64_t number = 0;
  uint64_t ttlMs = 0;

  wire::Request view() const {
    wire::Request r;
    r.op = op;
    r.keys.assign(keys.begin(), keys.end());
    r.values.assign(values.begin(), values.end());
    r.number = number;
    r.ttlMs = ttlMs;
    return r;
  }
  std::string describe() const {
    std::string text(wire::opName(op));
    for (size_t i = 0; i < keys.size() && i < 4; ++i) text += " " + keys[i];
    if (keys.size() > 4) text += " ...";
    if (op == Op::Add) text += " " + std::to_string(number);
    return text;
  }
};

// One TCP connection: the engine's peer on the server's side, the bytes that reached the client
// on the other.
struct SimStoreServer::Link : Peer {
  int id = 0;
  int owner = 0;
  int epoch = 0;
  std::string who;
  bool held = true;      // the server still holds it
  bool broken = false;   // the client's side is closed or reset
  std::string inbox;     // delivered, not yet read
  std::string outgoing;  // what the engine sent during the current request
  Time lastUp{}, lastDown{};
  void send(std::string_view bytes) override { outgoing.append(bytes); }
};

namespace {

// TcpStore's side of one connection (store/tcp_store.cpp): each call sends its request and reads
// the reply the engine gives, with the same deadline; any failure closes the connection.
class SimStore : public LeasingStore {
 public:
  SimStore(SimStoreServer& server, std::shared_ptr<SimStoreServer::Link> link)
      : server_(server), sim_(server.sim()), link_(std::move(link)) {}
  ~SimStore() override { close(); }

  void set(const std::string& key, const std::string& value) override {
    call({.op = Op::Set, .keys = {key}, .values = {value}});
  }
  std::string get(const std::string& key) override {
    wait({key}, kDefaultTimeout);
    return call({.op = Op::Get, .keys = {key}}, [&] { return bytes(); });
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return call({.op = Op::Add, .keys = {key}, .number = delta}, [&] { return i64(); });
  }
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override {
    return call({.op = Op::CompareSet, .keys = {key}, .values = {expected, desired}},
                [&] { return bytes(); });
  }
  bool deleteKey(const std::string& key) override {
    return call({.op = Op::DeleteKey, .keys = {key}}, [&] { return i64() == 1; });
  }
  bool check(const std::vector<std::string>& keys) override {
    return call({.op = Op::Check, .keys = keys},
                [&] { return u8() == static_cast<uint8_t>(wire::CheckReply::Ready); });
  }
  int64_t numKeys() override {
    return call({.op = Op::GetNumKeys}, [&] { return i64(); });
  }
  void append(const std::string& key, const std::string& value) override {
    call({.op = Op::Append, .keys = {key}, .values = {value}});
  }
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override {
    wait(keys, kDefaultTimeout);
    return peek(keys);
  }
  std::vector<std::string> peek(const std::vector<std::string>& keys) override {
    return call({.op = Op::MultiGet, .keys = keys}, [&] {
      std::vector<std::string> values;
      for (size_t i = 0; i < keys.size(); ++i) values.push_back(bytes());
      return values;
    });
  }
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override {
    requireSameLength(keys, values);
    call({.op = Op::MultiSet, .keys = keys, .values = values});
  }
  void lease(const std::string& key, const std::string& value, std::chrono::milliseconds ttl,
             const std::vector<std::pair<std::string, std::string>>& tripwires) override {
    requirePositiveTtl(key, ttl);
    SimStoreServer::Request r{.op = Op::Lease, .keys = {key}, .values = {value}};
    r.ttlMs = static_cast<uint64_t>(ttl.count());
    for (const auto& [tripwire, tripValue] : tripwires) {
      r.keys.push_back(tripwire);
      r.values.push_back(tripValue);
    }
    call(std::move(r), [&] {
      if (const uint8_t reply = u8(); reply != 0)
        throw ProtocolError("the store answered LEASE with " + std::to_string(reply));
      return 0;
    });
  }
  bool waitFor(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    return call({.op = Op::Wait, .keys = keys}, [&] {
      if (sim_.block([&] { return !link_->inbox.empty() || link_->broken; },
                     sim_.now() + timeout) &&
          !link_->broken) {
        if (u8() != static_cast<uint8_t>(wire::WaitReply::StopWaiting))
          throw ProtocolError("the store answered WAIT with an unexpected reply");
        return true;
      }
      requireUnbroken();
      // Cancel so the server forgets this wait; it may have answered just before.
      server_.send(link_, {.op = Op::CancelWait});
      uint8_t reply = u8();
      if (reply == static_cast<uint8_t>(wire::WaitReply::StopWaiting)) reply = u8();
      if (reply != static_cast<uint8_t>(wire::WaitReply::WaitCanceled))
        throw ProtocolError("the store answered CANCEL_WAIT with " + std::to_string(reply));
      return false;
    });
  }
  void abort() override { close(); }
  Clock::time_point now() override { return sim_.now(); }

 private:
  void call(SimStoreServer::Request request) {
    call(std::move(request), [] { return 0; });
  }
  // One call at a time on a connection, as TcpStore's lock makes it: the agent's reports and
  // its stop may come from two tasks at once.
  template <typename Read>
  std::invoke_result_t<Read&> call(SimStoreServer::Request request, Read&& read) {
    sim_.block([this] { return !busy_; });
    busy_ = true;
    struct Free {
      bool& busy;
      ~Free() { busy = false; }
    } free{busy_};
    try {
      requireUnbroken();
      server_.send(link_, std::move(request));
      return read();
    } catch (...) {
      close();
      throw;
    }
  }
  void requireUnbroken() const {
    if (link_->broken) throw NetworkError("lost the connection to the store (" + link_->who + ")");
  }
  std::string take(size_t n) {
    const Time deadline = sim_.now() + server_.shape().replyTimeout;
    if (!sim_.block([&] { return link_->inbox.size() >= n || link_->broken; }, deadline))
      throw TimeoutError("the store did not answer within " +
                         std::to_string(server_.shape().replyTimeout.count()) + " ms");
    requireUnbroken();
    server_.noteRead(link_->owner, link_->epoch);
    std::string out = link_->inbox.substr(0, n);
    link_->inbox.erase(0, n);
    return out;
  }
  uint8_t u8() { return static_cast<uint8_t>(take(1)[0]); }
  int64_t i64() { return static_cast<int64_t>(wire::loadU64(take(8).data())); }
  std::string bytes() { return take(wire::loadU64(take(8).data())); }
  void close() {
    if (link_->broken) return;
    link_->broken = true;
    server_.closeFromClient(link_);
  }

  SimStoreServer& server_;
  Simulation& sim_;
  std::shared_ptr<SimStoreServer::Link> link_;
  bool busy_ = false;
};

}  // namespace

SimStoreServer::SimStoreServer(Simulation& sim, NetworkShape shape)
    : sim_(sim), shape_(shape), engine_(std::make_unique<StoreEngine>()) {}

SimStoreServer::~SimStoreServer() {
  for (auto& link : links_) engine_->disconnect(*link);
}

bool SimStoreServer::up() const { return sim_.now() >= downUntil_; }

int SimStoreServer::lifeOfLastRead(int owner) const {
  const auto found = lastRead_.find(owner);
  return found == lastRead_.end() ? epoch_ : found->second;
}

std::unique_ptr<LeasingStore> SimStoreServer::open(int owner, const std::string& who) {
  sim_.sleep(latency());
  if (!up()) {
    // TcpStore tries again until its connect timeout, then says so.
    sim_.sleep(shape_.connectTimeout);
    throw ConnectionRefused("connection refused by the store (gave up after " +
                            std::to_string(shape_.connectTimeout.count()) + " ms)");
  }
  if (sim_.now() < pausedUntil_ && !sim_.block([this] { return sim_.now() >= pausedUntil_; },
                                               sim_.now() + shape_.handshakeTimeout))
    throw SilentServerError(
        "the server at the store is not a dlrun store (check the endpoint): it "
        "accepted the connection but sent nothing back for " +
        std::to_string(shape_.handshakeTimeout.count()) + " ms");
  auto link = std::make_shared<Link>();
  link->id = ++nextLink_;
  link->owner = owner;
  link->epoch = epoch_;
  link->who = who + "/c" + std::to_string(link->id);
  if (!up()) {  // it went down during the handshake
    link->held = false;
    link->broken = true;
  } else {
    links_.push_back(link);
  }
  sim_.note(link->who + " connected");
  return std::make_unique<SimStore>(*this, link);
}

void SimStoreServer::send(const std::shared_ptr<Link>& link, Request request) {
  link->lastUp = std::max(link->lastUp, sim_.now() + latency());
  sim_.at(link->lastUp, [this, link, request = std::make_shared<Request>(std::move(request))] {
    if (!link->held || link->epoch != epoch_) return;
    if (sim_.now() < pausedUntil_) {
      backlog_.emplace_back(link, request);
    } else {
      arrive(link, *request);
    }
  });
}

void SimStoreServer::arrive(const std::shared_ptr<Link>& link, const Request& request) {
  engine_->expireLeases(sim_.now());  // as MemoryStoreServer: due leases fire first
  flush();
  apply(link, request);
  flush();
  armTimer();
}

void SimStoreServer::apply(const std::shared_ptr<Link>& link, const Request& request) {
  try {
    engine_->handle(*link, request.view(), sim_.now());
  } catch (const RequestError& e) {
    sim_.note(link->who + " " + request.describe() + " refused: " + e.what());
    return cut(link, "refused");  // dlrund drops the connection
  }
  const bool lose = loseReplies_ > 0 && !link->outgoing.empty() && sim_.chance(loseReplies_);
  sim_.note(link->who + " " + request.describe() + (lose ? " (applied; reply lost)" : ""));
  if (lose) {
    link->outgoing.clear();
    cut(link, "reply lost");
  }
}

void SimStoreServer::flush() {
  for (auto& link : links_)
    if (!link->outgoing.empty()) deliver(link, std::exchange(link->outgoing, {}));
}

void SimStoreServer::deliver(const std::shared_ptr<Link>& link, std::string bytes) {
  link->lastDown = std::max(link->lastDown, sim_.now() + latency());
  sim_.at(link->lastDown, [link, bytes = std::move(bytes)] {
    if (!link->broken) link->inbox += bytes;
  });
}

void SimStoreServer::cut(std::shared_ptr<Link> link, const std::string& why) {
  if (!link->held) return;
  link->held = false;
  std::erase(links_, link);
  if (link->epoch == epoch_) engine_->disconnect(*link);
  sim_.note(link->who + " cut (" + why + ")");
  link->outgoing.clear();
  link->lastDown = std::max(link->lastDown, sim_.now() + latency());
  sim_.at(link->lastDown, [link] { link->broken = true; });
  flush();  // its tripwires may have woken others
  armTimer();
}

void SimStoreServer::closeFromClient(const std::shared_ptr<Link>& link) {
  sim_.at(sim_.now() + latency(), [this, link] {
    if (!link->held || link->epoch != epoch_) return;
    if (sim_.now() < pausedUntil_) {
      // A stopped server reads the close once it runs again, after what came before it.
      backlog_.emplace_back(link, nullptr);
      return;
    }
    cut(link, "closed by " + link->who);
  });
}

void SimStoreServer::armTimer() {
  const auto next = engine_->nextLeaseDeadline();
  if (!next || (timerAt_ && *timerAt_ <= *next)) return;
  timerAt_ = *next;
  sim_.at(*next, [this, epoch = epoch_, at = *next] {
    if (timerAt_ == at) timerAt_.reset();
    if (epoch != epoch_ || sim_.now() < pausedUntil_) return;  // resume() looks again
    engine_->expireLeases(sim_.now());
    flush();
    armTimer();
  });
}

void SimStoreServer::pause(Duration d) {
  pausedUntil_ = std::max(pausedUntil_, sim_.now() + d);
  sim_.note("store stopped for " + std::to_string(d.count()) + " ms");
  sim_.at(pausedUntil_, [this] { resume(); });
}

void SimStoreServer::resume() {
  if (sim_.now() < pausedUntil_) return;  // paused again meanwhile: a later resume
  sim_.note("store runs again");
  engine_->expireLeases(sim_.now());
  flush();
  for (auto& [link, request] : std::exchange(backlog_, {})) {
    if (!link->held || link->epoch != epoch_) continue;
    if (request)
      apply(link, *request);
    else
      cut(link, "closed by " + link->who);
    flush();
  }
  timerAt_.reset();
  armTimer();
}

void SimStoreServer::restart(Duration down) {
  sim_.note("store restarts without its keys, down for " + std::to_string(down.count()) + " ms");
  ++epoch_;
  for (auto& link : std::exchange(links_, {})) {
    link->held = false;
    link->outgoing.clear();
    sim_.at(sim_.now() + latency(), [link] { link->broken = true; });
  }
  backlog_.clear();
  engine_ = std::make_unique<StoreEngine>();
  timerAt_.reset();
  downUntil_ = sim_.now() + down;
  pausedUntil_ = sim_.now();
}

void SimStoreServer::cutRandomLink() {
  if (links_.empty()) return;
  cut(links_[static_cast<size_t>(sim_.uniform(0, static_cast<int64_t>(links_.size()) - 1))],
      "a network fault");
}

void SimStoreServer::cutLinksOf(int owner) {
  for (auto link : std::vector(links_))
    if (link->owner == owner) cut(link, "its process died");
}

}  // namespace dlrun::sim
