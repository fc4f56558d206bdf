// The multi-node rendezvous over a dlrun store (the keys and rules are in elastic_protocol.h),
// reached through LeasingStore: a TcpStore to dlrund, or in tests a virtual-time MemoryStore.
// Each agent costs O(1) store operations per round: one ADD for its arrival index, one leased
// record, one wait for the round to close and one read of the outcome with its own
// assignment; the one agent that closes a round reads every record once and writes every
// assignment once.
//
// Liveness: an agent's record is a lease on the store, renewed by every request on the lease
// connection (a wait is cut into heartbeat-long pieces, so an idle agent still renews). When
// the connection drops (a killed agent) or the lease lapses (a silent node), the store itself
// ends the round, and every agent waiting on the round's end key wakes at once.
//
// Threads: next() and awaitEnd() block and run on one thread (the agent's rendezvous thread);
// reportFailure()/reportSuccess() run on another over a second connection (opened at the first
// report), only between a next() that returned a World and the following next(); interrupt()
// may be called from anywhere.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "common/clock.h"
#include "common/host_port.h"
#include "rendezvous/elastic_protocol.h"
#include "rendezvous/rendezvous.h"

namespace dlrun {
class LeasingStore;
class Store;
}  // namespace dlrun

namespace dlrun::rendezvous {

// Stops the whole job `keys` names, from any agent or from the control plane: the first stop
// written wins and is returned; the end of `round` (-1: none) and of the newest round are set
// to it, so members and nodes waiting for a round to close all wake.
RoundEnd stopJob(Store& store, const elastic::Keys& keys, const RoundEnd& stop, int round = -1);

// A rendezvous store other than dlrun's over TCP (etcd's, or in tests a virtual-time
// MemoryStore's): the rendezvous measures every deadline on the store's now().
struct StoreOpener {
  std::string name;  // the store in messages ("etcd1:2379, etcd2:2379")
  // Opens one connection to the store (one while joining, two once a report went). May throw
  // ConnectionRefused or NetworkError: connecting is retried until the join timeout.
  std::function<std::unique_ptr<LeasingStore>()> open;
  // A simulated store's clock, for the times no connection is open to ask (before the first,
  // and the pauses between tries while it is away). Empty: the real clock.
  std::function<Clock::time_point()> now;
  std::function<void(std::chrono::milliseconds)> pause;
};

struct ElasticOptions {
  std::string runId;
  int minNodes = 1;
  int maxNodes = 1;
  RestartPolicy restarts;
  // Where the rounds are: the c10d store, which the rendezvous dials (a TcpStore whose reply
  // deadline and connect tries follow leaseTtl and heartbeat) and the workers use unless a round
  // names theirs; or a store that `open` opens. Where the c10d store's host is a name the launch
  // resolved (HostPort::address), each new connection resolves it again and the rounds give the
  // workers the address it found, so a store that moved to another address under the same name
  // (a replaced Kubernetes pod behind a headless service) is followed.
  std::variant<HostPort, StoreOpener> store;
  // addr, name, nproc, rank hint and the workers' store port (etcd); worker ports are chosen
  // per round
  elastic::NodeRecord self;
  std::chrono::milliseconds lastCall{1'000};
  std::chrono::milliseconds joinTimeout{600'000};
  std::chrono::milliseconds heartbeat{1'000};
  std::chrono::milliseconds leaseTtl{3'000};
  // How long the store may be away (store_outage_timeout) before this node gives up on its
  // round: until then its workers keep running, its reports wait, and a round the store still
  // holds intact when it answers goes on (ARCHITECTURE.md section 4).
  std::chrono::milliseconds storeOutage{60'000};
  // This agent's id in its records (NodeRecord::id). Empty: 64 random bits. The simulation
  // names its agents', so that a seed replays the same rounds.
  std::string memberId;
  // How the workers' free ports are found: reserveFreePorts (empty), or the simulation's.
  std::function<std::vector<uint16_t>(const std::string& host, int count)> workerPorts;
  // Read every worker's endpoint (O(N) bytes, for TF_CONFIG). Off only in load generators that
  // measure the rendezvous alone.
  bool fetchRoster = true;
  // A node once lost is not taken back in this job (Slurm: its place went to a spare).
  bool refuseLostNodes = false;
  // A deliberate stop of this node (reportStop) makes only it leave while the job keeps at
  // least minNodes; otherwise (the default) it stops the whole job.
  bool stopOnlyNode = false;
  // Where a finished job's keys stay (etcd, which outlives its jobs: "etcd under PREFIX/ID/"):
  // a rendezvous id whose keys say the job ended is refused (ConfigError naming it, and when
  // its keys expire: Keys::expiry), where it would hand every agent of a new job the old
  // outcome at once. Empty: not checked.
  std::string endedJobKeys;
};

namespace detail {
class ElasticImpl;
}

class ElasticRendezvous : public Rendezvous {
 public:
  // Connects to the store, retrying until the join timeout; refuses a rendezvous id already
  // used by a job with another --nnodes range, or (endedJobKeys) by a job that ended
  // (ConfigError).
  explicit ElasticRendezvous(ElasticOptions options);
  ~ElasticRendezvous() override;

  // Blocks until this node is a member of a closed round, waiting as a spare while the job
  // runs at its maximum size. Throws TimeoutError when too few nodes join in time.
  JoinResult next() override;
  // Blocks until the round this node is in ends. A store that stops answering is waited for up
  // to storeOutage, the workers running; one away longer, or back without the job's keys (a
  // dlrund that restarted), ends the round as Kind::StoreLost, and the next next() meets the
  // other nodes in a new round.
  RoundEnd awaitEnd() override;

  // The reports: one that the store does not take (it is away) is made again by awaitEnd()
  // once the store answers.
  void reportFailure(RoundEnd failure) override;
  // The last member whose workers all succeeded ends the round as Finished.
  void reportSuccess() override;
  // Safe at any time, also while next() runs on the rendezvous thread.
  RoundEnd reportStop(int signal) override;
  void reportLost(const std::string& what) override;
  // Over a connection of their own (kept from one call to the next), so they never wait behind
  // the agent's reports.
  void shareWithRound(RoundTopic topic, const std::string& text) override;
  std::vector<std::string> gatherFromRound(RoundTopic topic,
                                           std::chrono::milliseconds timeout) override;

  // Offered to the next next() alone, whatever it returns.
  void offerKept(const KeptWorkers& kept, std::function<void()> dropped) override;
  void whenSpare(std::function<void()> waiting) override;
  void interrupt() override;

 private:
  std::unique_ptr<detail::ElasticImpl> impl_;
};

}  // namespace dlrun::rendezvous
