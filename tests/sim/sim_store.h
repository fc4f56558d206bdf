// The store in the simulation: dlrund's StoreEngine behind a simulated network, and a client of
// it that speaks as TcpStore does (the same requests, the same replies read in the same order,
// the same errors), on the simulation's clock. Each connection is ordered (TCP); latencies
// differ per message, so deliveries across connections reorder. Faults: a connection cut, a
// reply lost after the store applied its request (the connection breaks), the store stopped
// (SIGSTOP: requests wait, connections stay), and the store restarted without its keys.
#pragma once

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

class SimStoreServer {
 public:
  SimStoreServer(Simulation& sim, NetworkShape shape);
  ~SimStoreServer();

  // In a task of `owner`: one connection, as TcpStore opens one (ConnectionRefused while the
  // store is down, NotAStoreError when it accepts and says nothing). `who` names it in traces.
  std::unique_ptr<LeasingStore> open(int owner, const std::string& who);

  // Faults.
  void pause(Duration d);
  void restart(Duration down);
  void cutRandomLink();
  void cutLinksOf(int owner);  // its process died: the kernel closes its sockets
  void loseReplies(double probability) { loseReplies_ = probability; }

  // For invariants: the engine's value of `key` is not exposed; the checks read the agents'.
  bool up() const;
  int life() const { return epoch_; }  // restarts so far
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
};

}  // namespace dlrun::sim
