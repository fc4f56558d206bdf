// The store in the simulation: dlrund's StoreEngine behind a simulated network, and a client of
// it that speaks as TcpStore does (the same requests, the same replies read in the same order,
// the same errors), on the simulation's clock. Each connection is ordered (TCP); latencies
// differ per message, so deliveries across connections reorder. Faults: a connection cut, a
// reply lost after the store applied its request (the connection breaks), the store stopped
// (SIGSTOP: requests wait, connections stay), and the store restarted without its keys.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "store/leasing_store.h"
#include "store/store_engine.h"
#include "tests/sim/simulation.h"

namespace dlrun::sim {

struct NetworkShape {
  Duration latencyLow{0};
  Duration latencyHigh{20};
  Duration replyTimeout{4'000};    // TcpStore's: lease TTL + heartbeat
  Duration connectTimeout{1'000};  // TcpStore's tries: a heartbeat
  Duration handshakeTimeout{3'000};
};

// A rendezvous store in the simulation, as the schedule's faults reach it: dlrund's
// (SimStoreServer) or etcd's (sim_etcd.h).
class SimBackend {
 public:
  virtual ~SimBackend() = default;
  virtual std::string name() const = 0;  // "dlrund", "etcd"
  // In a task of `owner`: one connection, as the production client opens one. `who` names it
  // in traces.
  virtual std::unique_ptr<LeasingStore> open(int owner, const std::string& who) = 0;
  // The store stops answering for `d` (SIGSTOP, an election), keeping its connections.
  virtual void pause(Duration d) = 0;
  // The store goes away for `down`: dlrund restarts without its keys, etcd keeps them.
  virtual void restart(Duration down) = 0;
  virtual void cutRandomLink() = 0;
  virtual void cutLinksOf(int owner) = 0;  // its process died
  // Each reply lost with `probability` after its request was applied.
  virtual void loseReplies(double probability) = 0;
  // The store's life (restarts that lost its keys) that `owner`'s last reply came from: a round
  // read just before a restart belongs to the life before it.
  virtual int lifeOfLastRead(int owner) const = 0;
};

class SimStoreServer : public SimBackend {
 public:
  SimStoreServer(Simulation& sim, NetworkShape shape);
  ~SimStoreServer() override;

  std::string name() const override { return "dlrund"; }
  // ConnectionRefused while the store is down, SilentServerError when it accepts and says
  // nothing, as TcpStore's connect.
  std::unique_ptr<LeasingStore> open(int owner, const std::string& who) override;
  void pause(Duration d) override;
  void restart(Duration down) override;
  void cutRandomLink() override;
  void cutLinksOf(int owner) override;  // the kernel closes its sockets
  void loseReplies(double probability) override { loseReplies_ = probability; }
  int lifeOfLastRead(int owner) const override;

  bool up() const;
  void noteRead(int owner, int life) { lastRead_[owner] = life; }
  const NetworkShape& shape() const { return shape_; }
  Simulation& sim() { return sim_; }

  struct Link;
  struct Request;
  void send(const std::shared_ptr<Link>& link, Request request);
  void closeFromClient(const std::shared_ptr<Link>& link);
  Duration latency() { return sim_.between(shape_.latencyLow, shape_.latencyHigh); }

 private:
  void arrive(const std::shared_ptr<Link>& link, const Request& request);
  void apply(const std::shared_ptr<Link>& link, const Request& request);
  void flush();
  void deliver(const std::shared_ptr<Link>& link, std::string bytes);
  void cut(std::shared_ptr<Link> link, const std::string& why);  // by value: it may be links_'s
  void armTimer();
  void resume();

  Simulation& sim_;
  const NetworkShape shape_;
  std::unique_ptr<StoreEngine> engine_;
  int epoch_ = 0;
  int nextLink_ = 0;
  Time downUntil_{};
  Time pausedUntil_{};
  std::vector<std::pair<std::shared_ptr<Link>, std::shared_ptr<Request>>> backlog_;
  std::vector<std::shared_ptr<Link>> links_;  // the ones the engine holds
  std::optional<Time> timerAt_;
  double loseReplies_ = 0;
  std::map<int, int> lastRead_;
};

}  // namespace dlrun::sim
