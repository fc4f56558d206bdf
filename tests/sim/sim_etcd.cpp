#include "tests/sim/sim_etcd.h"

#include <algorithm>
#include <utility>

#include "common/error.h"

namespace dlrun::sim {

// The cluster's state: what every client shares.
struct SimEtcd::Model {
  struct Entry {
    std::string value;
    int64_t lease = 0;  // 0: none
  };
  struct Lease {
    Duration ttl;
    Time deadline;
    std::map<std::string, std::vector<std::pair<std::string, std::string>>> keys;  // tripwires
  };

  explicit Model(Simulation& sim) : sim(sim) {}

  Simulation& sim;
  std::map<std::string, Entry> kv;
  std::map<int64_t, Lease> leases;
  int64_t nextLease = 1;
  Time unavailableUntil{};
  std::set<Time> timers;
  std::vector<std::weak_ptr<Session>> sessions;

  bool available() const { return sim.now() >= unavailableUntil; }
  bool has(const std::string& key) const { return kv.count(key) > 0; }
  std::string value(const std::string& key) const {
    const auto found = kv.find(key);
    return found == kv.end() ? std::string() : found->second.value;
  }
  void put(const std::string& key, const std::string& value, int64_t lease = 0) {
    Entry& entry = kv[key];
    detach(key, entry.lease);
    entry = {value, lease};
  }
  void erase(const std::string& key) {  // a release: no tripwire fires
    const auto found = kv.find(key);
    if (found == kv.end()) return;
    detach(key, found->second.lease);
    kv.erase(found);
  }
  void detach(const std::string& key, int64_t lease) {
    if (const auto found = leases.find(lease); found != leases.end()) found->second.keys.erase(key);
  }
  // A lease's end (lapsed or revoked): its keys go and their tripwires fire, each only where
  // its key is absent, as EtcdStore's watchers fire them.
  void end(int64_t id, const std::string& why) {
    const auto found = leases.find(id);
    if (found == leases.end()) return;
    const auto keys = std::move(found->second.keys);
    leases.erase(found);
    sim.note("etcd lease " + std::to_string(id) + " " + why);
    for (const auto& [key, tripwires] : keys) {
      kv.erase(key);
      for (const auto& [wire, value] : tripwires)
        if (!has(wire)) put(wire, value);
    }
  }
  void armTimers() {
    for (const auto& [id, lease] : leases) {
      if (timers.count(lease.deadline)) continue;
      timers.insert(lease.deadline);
      sim.at(lease.deadline, [this, at = lease.deadline] {
        timers.erase(at);
        expire();
      });
    }
  }
  void expire() {
    if (!available()) return;  // no leader: nothing lapses; the TTLs restart once one is back
    std::vector<int64_t> due;
    for (const auto& [id, lease] : leases)
      if (lease.deadline <= sim.now()) due.push_back(id);
    for (int64_t id : due) end(id, "lapsed");
    armTimers();
  }
};

// One EtcdStore's connection and lease, shared with its keep-alive task.
struct SimEtcd::Session {
  int owner = 0;
  std::string who;
  int64_t lease = 0;      // 0: none granted, or lost
  bool closed = false;    // aborted or destroyed
  bool failNext = false;  // its next call fails on the network
};

namespace {

constexpr Duration kMinTtl{2'000};

class SimEtcdStore : public LeasingStore {
 public:
  SimEtcdStore(Simulation& sim, const NetworkShape& shape, std::shared_ptr<SimEtcd::Model> model,
               std::shared_ptr<SimEtcd::Session> session, const double& loseReplies)
      : sim_(sim),
        shape_(shape),
        model_(std::move(model)),
        session_(std::move(session)),
        loseReplies_(loseReplies) {}
  ~SimEtcdStore() override { revoke(); }

  void set(const std::string& key, const std::string& value) override {
    call("PUT " + key, [&] {
      model_->put(key, value);
      return true;
    });
  }
  std::string get(const std::string& key) override {
    wait({key}, kDefaultTimeout);
    return peek({key}).front();
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return call("ADD " + key, [&] { return addNow(key, delta); });
  }
  std::string compareSet(const std::string& key, const std::string& expected,
                         const std::string& desired) override {
    return call("TXN compare-set " + key, [&] { return compareSetNow(key, expected, desired); });
  }
  bool deleteKey(const std::string& key) override {
    return call("DELETE " + key, [&] {
      const bool had = model_->has(key);
      model_->erase(key);
      return had;
    });
  }
  void deleteKeys(const std::vector<std::string>& keys) override {
    call("TXN delete " + std::to_string(keys.size()) + " keys", [&] {
      for (const auto& key : keys) model_->erase(key);
      return true;
    });
  }
  bool check(const std::vector<std::string>& keys) override {
    return call("RANGE check", [&] { return allPresent(keys); });
  }
  int64_t numKeys() override {
    return call("RANGE count", [&] { return static_cast<int64_t>(model_->kv.size()); });
  }
  void append(const std::string& key, const std::string& value) override {
    call("TXN append " + key, [&] {
      model_->put(key, model_->value(key) + value);
      return true;
    });
  }
  std::vector<std::string> multiGet(const std::vector<std::string>& keys) override {
    wait(keys, kDefaultTimeout);
    return peek(keys);
  }
  std::vector<std::string> peek(const std::vector<std::string>& keys) override {
    return call("RANGE " + keys.front(), [&] { return values(keys); });
  }
  void multiSet(const std::vector<std::string>& keys,
                const std::vector<std::string>& values) override {
    requireSameLength(keys, values);
    call("TXN put " + std::to_string(keys.size()) + " keys", [&] {
      for (size_t i = 0; i < keys.size(); ++i) model_->put(keys[i], values[i]);
      return true;
    });
  }
  void lease(const std::string& key, const std::string& value, std::chrono::milliseconds ttl,
             const std::vector<std::pair<std::string, std::string>>& tripwires) override {
    requirePositiveTtl(key, ttl);
    call("TXN lease " + key, [&] {
      leaseNow(key, value, ttl, tripwires);
      return true;
    });
  }
  int64_t addThenLease(const std::string& counter, int64_t limit,
                       const std::function<std::string(int64_t)>& keyOf, const std::string& value,
                       std::chrono::milliseconds ttl,
                       const std::vector<std::pair<std::string, std::string>>& tripwires) override {
    requirePositiveTtl(counter, ttl);
    return call("TXN add-then-lease " + counter, [&] {
      const int64_t n = addNow(counter, 1);
      if (n <= limit) leaseNow(keyOf(n), value, ttl, tripwires);
      return n;
    });
  }
  std::vector<std::string> createThenPeek(const std::string& key, const std::string& value,
                                          const std::vector<std::string>& keys) override {
    return call("TXN create-then-peek " + key, [&] {
      std::vector<std::string> out{compareSetNow(key, "", value)};
      for (auto& found : values(keys)) out.push_back(std::move(found));
      return out;
    });
  }
  bool waitFor(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    // A watch and a read: the answer travels as any reply does.
    const Time deadline = sim_.now() + timeout;
    travel();
    const bool found = sim_.block(
        [&] { return session_->closed || (model_->available() && allPresent(keys)); }, deadline);
    requireOpen();
    if (found) travel();
    return found && allPresent(keys);
  }
  void abort() override { revoke(); }
  bool outlivesFailures() const override { return true; }
  Clock::time_point now() override { return sim_.now(); }

 private:
  // One request: it travels, applies whole at the cluster (once: a call made again after a lost
  // reply applies alike), and its answer travels back.
  template <typename Apply>
  auto call(const std::string& what, Apply&& apply) -> decltype(apply()) {
    requireOpen();
    travel();
    if (std::exchange(session_->failNext, false))
      throw NetworkError("the connection to etcd failed (" + session_->who + ")");
    // EtcdStore makes a call again on the next member for up to its deadline.
    if (!sim_.block([&] { return model_->available() || session_->closed; },
                    sim_.now() + shape_.replyTimeout))
      throw TimeoutError("etcd did not answer within " +
                         std::to_string(shape_.replyTimeout.count()) + " ms");
    requireOpen();
    sim_.note(session_->who + " " + what);
    auto result = apply();
    model_->armTimers();
    if (loseReplies_ > 0 && sim_.chance(loseReplies_)) {
      sim_.note(session_->who + " reply lost: the call is made again");
      travel();
      travel();
    }
    travel();
    return result;
  }
  void travel() { sim_.sleep(sim_.between(shape_.latencyLow, shape_.latencyHigh)); }
  void requireOpen() const {
    if (session_->closed) throw NetworkError("the etcd store was aborted");
  }
  bool allPresent(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return model_->has(k); });
  }
  std::vector<std::string> values(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& key : keys) out.push_back(model_->value(key));
    return out;
  }
  int64_t addNow(const std::string& key, int64_t delta) {
    const std::string text = model_->value(key);
    const int64_t sum = (text.empty() ? 0 : storedCount(text, key)) + delta;
    model_->put(key, std::to_string(sum));
    return sum;
  }
  std::string compareSetNow(const std::string& key, const std::string& expected,
                            const std::string& desired) {
    if (!model_->has(key)) {
      if (!expected.empty()) return expected;
      model_->put(key, desired);
      return desired;
    }
    if (model_->value(key) == expected) model_->put(key, desired);
    return model_->value(key);
  }
  void leaseNow(const std::string& key, const std::string& value, Duration ttl,
                const std::vector<std::pair<std::string, std::string>>& tripwires) {
    if (session_->lease == 0 || !model_->leases.count(session_->lease)) grant(ttl);
    model_->put(key, value, session_->lease);
    model_->leases.at(session_->lease).keys[key] = tripwires;
  }
  void grant(Duration ttl) {
    const Duration whole((ttl.count() + 999) / 1000 * 1000);
    const Duration granted = std::max(whole, kMinTtl);
    const int64_t id = model_->nextLease++;
    model_->leases[id] = {granted, sim_.now() + granted, {}};
    session_->lease = id;
    sim_.note(session_->who + " granted etcd lease " + std::to_string(id));
    // The keep-alive: a task of the agent's, renewing a third of the TTL apart.
    sim_.spawn(session_->owner, [sim = &sim_, model = model_, session = session_, id, granted] {
      while (true) {
        sim->sleep(granted / 3);
        if (session->closed || session->lease != id || !model->leases.count(id)) return;
        if (model->available()) model->leases.at(id).deadline = sim->now() + granted;
      }
    });
  }
  void revoke() {
    if (session_->closed) return;
    session_->closed = true;
    const int64_t id = std::exchange(session_->lease, 0);
    if (id == 0) return;
    // The revoke travels; an etcd that does not answer lets the lease lapse instead.
    sim_.at(sim_.now() + sim_.between(shape_.latencyLow, shape_.latencyHigh), [model = model_, id] {
      if (model->available()) model->end(id, "revoked");
    });
  }

  Simulation& sim_;
  const NetworkShape& shape_;
  std::shared_ptr<SimEtcd::Model> model_;
  std::shared_ptr<SimEtcd::Session> session_;
  const double& loseReplies_;
};

}  // namespace

SimEtcd::SimEtcd(Simulation& sim, NetworkShape shape)
    : sim_(sim), shape_(shape), model_(std::make_shared<Model>(sim)) {}

SimEtcd::~SimEtcd() = default;

std::unique_ptr<LeasingStore> SimEtcd::open(int owner, const std::string& who) {
  auto session = std::make_shared<Session>();
  session->owner = owner;
  session->who = who + "/e" + std::to_string(model_->sessions.size() + 1);
  model_->sessions.push_back(session);
  sim_.note(session->who + " opened");
  return std::make_unique<SimEtcdStore>(sim_, shape_, model_, std::move(session), loseReplies_);
}

void SimEtcd::pause(Duration d) {
  model_->unavailableUntil = std::max(model_->unavailableUntil, sim_.now() + d);
  sim_.note("etcd answers nothing for " + std::to_string(d.count()) + " ms");
  sim_.at(model_->unavailableUntil, [this] {
    if (!model_->available()) return;
    sim_.note("etcd answers again; every lease's TTL starts anew");
    for (auto& [id, lease] : model_->leases) lease.deadline = sim_.now() + lease.ttl;
    model_->armTimers();
  });
}

void SimEtcd::cutRandomLink() {
  std::vector<std::shared_ptr<Session>> open;
  for (const auto& weak : model_->sessions)
    if (auto session = weak.lock(); session && !session->closed) open.push_back(session);
  if (open.empty()) return;
  auto& session = open[static_cast<size_t>(sim_.uniform(0, static_cast<int64_t>(open.size()) - 1))];
  session->failNext = true;
  sim_.note(session->who + "'s connection fails");
}

}  // namespace dlrun::sim
