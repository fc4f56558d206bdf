// The single-node rendezvous: the world is this node alone, the store is the agent's own, and
// a round ends only through this node's own reports. It counts failure restarts like the
// elastic rendezvous does (RoundEnd::countFailure), so the agent has one restart path.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>

#include "common/host_port.h"
#include "rendezvous/rendezvous.h"

namespace dlrun::rendezvous {

struct LocalRendezvousOptions {
  std::string runId;
  int localWorldSize = 1;
  RestartPolicy restarts;
  HostPort store;                      // where workers reach the agent's store
  std::string hostAddr = "127.0.0.1";  // this node's address in TF_CONFIG
  std::string nodeName;                // this node in messages
  std::vector<std::string> roles;      // each worker's role under --roles; else empty
};

class LocalRendezvous : public Rendezvous {
 public:
  explicit LocalRendezvous(LocalRendezvousOptions options) : options_(std::move(options)) {}
  // Never blocks. Each round reserves a fresh free port per worker for TF_CONFIG.
  JoinResult next() override;
  // Blocks until this node reports; throws Error once interrupted.
  RoundEnd awaitEnd() override;
  void reportFailure(RoundEnd failure) override;
  void reportSuccess() override;
  // One node: the job stops with it.
  RoundEnd reportStop(int signal) override;
  // One node serves its own workers' store: never called.
  void reportLost(const std::string&) override {}
  // One node: its own text is all there is.
  void shareWithRound(RoundTopic topic, const std::string& text) override;
  std::vector<std::string> gatherFromRound(RoundTopic topic,
                                           std::chrono::milliseconds timeout) override;
  void interrupt() override;

 private:
  const LocalRendezvousOptions options_;
  int round_ = 0;
  int failures_ = 0;  // failure restarts used so far
  std::mutex mutex_;  // the agent's thread reports while the rendezvous thread awaits
  std::condition_variable ended_;
  std::optional<RoundEnd> end_;
  std::map<RoundTopic, std::string> shared_;
  bool interrupted_ = false;
};

}  // namespace dlrun::rendezvous
