// etcd in the simulation: a model of what the rendezvous relies on (rendezvous/etcd/
// etcd_store.h), so the rounds run on etcd's semantics as well as dlrund's. Keys without
// revisions (the rendezvous compares values and absence only); transactions applied whole (the
// add-then-lease and create-then-peek the store makes one request); waits as watches (the
// answer once every key exists, a network's latency later); leases owned by the server with a
// TTL of whole seconds (at least 2 s), kept alive by a task of the agent (stopped or killed with
// it: its keys lapse after the TTL, not when its connections drop), revoked when a store is
// aborted or destroyed, their tripwires fired when a leased key lapses. A connection that fails
// leaves the store and its lease usable (outlivesFailures): calls are made again as EtcdStore
// makes them, safely, so a reply lost after its write applied costs a retry. The cluster keeps
// its keys when it stops answering (an election, a lost quorum) and renews every lease's TTL
// when it answers again, as etcd's lessor does on a new leader.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "tests/sim/sim_store.h"

namespace dlrun::sim {

class SimEtcd : public SimBackend {
 public:
  SimEtcd(Simulation& sim, NetworkShape shape);
  ~SimEtcd() override;

  std::string name() const override { return "etcd"; }
  std::unique_ptr<LeasingStore> open(int owner, const std::string& who) override;
  void pause(Duration d) override;
  void restart(Duration down) override { pause(down); }  // its keys are on disk
  void cutRandomLink() override;
  void cutLinksOf(int owner) override {}  // a dead process only stops renewing its lease
  void loseReplies(double probability) override { loseReplies_ = probability; }
  int lifeOfLastRead(int owner) const override { return 0; }

  struct Model;
  struct Session;

 private:
  Simulation& sim_;
  const NetworkShape shape_;
  std::shared_ptr<Model> model_;
  double loseReplies_ = 0;
};

}  // namespace dlrun::sim
