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

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/error.h"
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

struct ElasticOptions {
  std::string runId;
  int minNodes = 1;
  int maxNodes = 1;
  int maxRestarts = 0;
  std::string storeHost;   // with storePort 0: the store's name for messages (etcd's endpoints)
  uint16_t storePort = 0;
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
  // Opens one connection to the store (one while joining, two once a report went). Empty: a
  // TcpStore to storeHost:storePort whose reply deadline and connect tries follow leaseTtl and heartbeat.
  // Tests pass MemoryStore connections to a virtual-time server; the rendezvous measures every
  // deadline on the store's now(). May throw ConnectionRefused or NetworkError: connecting is
  // retried until the join timeout.
  std::function<std::unique_ptr<LeasingStore>()> connect;
};

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
  // Over a connection of their own, so they never wait behind the agent's reports.
  void shareHangReport(const std::string& report) override;
  std::vector<std::string> gatherHangReports(std::chrono::milliseconds timeout) override;

  void interrupt() override;

 private:
  // A store outage (elastic_rendezvous_outage.cpp). rideOut, after a call failed with
  // `failure`: waits until the store answers again (one line when it went, saying what goes
  // on `meanwhile`, one when it came back), opening a new connection where the failed one died
  // with its lease. Throws NetworkError once the store was away for storeOutage since its last
  // answer (`since`), or refused connections for a lease's TTL (the agent that served it has
  // exited), or on interrupt().
  void rideOut(const Error& failure, Clock::time_point since, const std::string& meanwhile);
  // After a loss, a store that refuses connections (rather than a network that drops them) for
  // a lease's life is gone for good: the agent that served it has exited, and its keys with it.
  class Refusals {
   public:
    // Notes a try that failed at `at`; throws NetworkError naming `store` once every try was
    // refused for `ttl`.
    void note(const Error& failure, Clock::time_point at, Clock::duration ttl,
              const std::string& store);

   private:
    bool refusing_ = false;  // every try since since_ was refused
    Clock::time_point since_{};
  };
  static bool isOutage(const Error& error);
  void reopen();
  // Whether the store lost the job's keys (it restarted without them); then the keys nodes
  // arriving later read first are written again, the newest round as `round`.
  bool restoreIfReset(int round);
  // Writes the job's shape and newest round (`round`) again where missing; returns the round
  // the store names now.
  int restoreAfterReset(int round);
  // The end of round `round` once the store came back after an outage: its end if set, this
  // node lost where the round is forgotten (it slept through two rounds), the store's restart
  // where the store lost it; nothing while it goes on.
  std::optional<RoundEnd> roundAfterOutage(int round);
  // A join the store's outage cut short: the round is aborted, or ended where it closed
  // meanwhile, so that every node meets in the next one.
  void abandonJoin(int round);
  // This node's loss, as its lease's tripwire writes it.
  RoundEnd selfLost() const {
    return {.kind = RoundEnd::Kind::NodeLost, .node = elastic::nodeName(options_.self)};
  }
  using Write = std::function<void(Store&)>;
  // Makes a report now, or keeps it for replayReports() while the store is away.
  void report(const std::string& what, const Write& write);
  void replayReports();

  struct Member {
    int round = 0;
    int index = 0;    // arrival index in the round
    int members = 0;  // the round's size
    int failures = 0; // failure restarts used before the round
  };
  struct Ended {      // the last round this node saw end
    int round = 0;
    int members = 0;
    int spares = 0;   // agents that waited for a place in it
    RoundEnd::Kind kind{};
  };
  // What a round gave this node: a place, the job's end, or a reason to try the next round.
  struct NextRound {};
  using Step = std::variant<World, RoundEnd, NextRound>;

  void connect(Clock::time_point deadline);
  // next()'s one try: from the job's newest round (or the one after this node's) until it has
  // a place or the job's end.
  JoinResult join(Clock::time_point deadline);
  // ConfigError when the job's keys say it ended: from `stop`, the newest round (`current`;
  // round 0's end is `firstEnd`) and the job's Expiry.
  void refuseEndedJob(const std::string& stop, const std::string& current,
                      const std::string& firstEnd, const std::string& expiry);
  std::unique_ptr<LeasingStore> openStore() const;
  std::string storeName() const;  // the store as messages name it
  // The store's time (lease_'s, even a lost one's); the real clock before the first connection.
  Clock::time_point now() const;
  // One read at the start: the job's shape (checked), whether it ended (endedJobKeys), and
  // what the first next() needs (kept in firstLook_).
  void lookFirst();
  Step tryRound(int round, Clock::time_point deadline);
  // Closes the round if no other node does first. When this node closed it: what a member
  // reads once a round closed (see memberWorld), as written, so the closer reads nothing more.
  std::optional<std::vector<std::string>> closeRound(int round, int index);
  // `texts`: the round's closed value, this member's assignment, and the roster when fetched.
  World memberWorld(int round, int index, int members, const std::vector<std::string>& texts);
  Step afterLateArrival(int round, int members);
  RoundEnd readEnd(int round);
  // The join timeout's error, naming the last round's members that did not come back.
  TimeoutError timedOut(int round);
  int spares(int round);
  int targetSize(int round) const;
  void advanceCurrent(int toRound);
  bool waitChunk(const std::string& key);
  // Deletes the keys of the rounds up to `upTo` not deleted yet (Keys::forgotten()).
  void forgetRounds(int upTo);
  // Whether round `round`'s keys are gone: an agent that slept through two rounds must not
  // wait for one of its keys for ever.
  bool forgotten(int round);

  const ElasticOptions options_;
  const elastic::Keys keys_;
  // This agent's id in its records (NodeRecord::id): its assignments' key.
  const std::string memberId_;
  // The job's stop, this node's lost mark and the newest round, as lookFirst() read them: the
  // first next() reads nothing more before it joins.
  std::optional<std::vector<std::string>> firstLook_;
  std::unique_ptr<LeasingStore> lease_;    // joins, waits and this node's lease
  // Reports from the agent's thread: each call holds its own reference, so the rendezvous
  // thread dropping the connection (a reconnect) never destroys it under a call.
  std::shared_ptr<LeasingStore> control_;
  std::shared_ptr<LeasingStore> control();
  std::optional<Member> member_;
  // The round this node is a member of (-1: none) and its size, for reportStop(), which may
  // run on the agent's thread while next() runs.
  std::atomic<int> memberRound_{-1};
  std::atomic<int> memberCount_{0};
  std::atomic<int> memberIndex_{0};
  std::optional<int> lastRound_;  // the last round this node was a member of, for messages
  std::optional<Ended> ended_;
  int failures_ = 0;  // failure restarts seen in this job (the rendezvous thread's copy)
  std::optional<int> lastGroupRank_;
  std::optional<int> closedRound_;  // the last round this node closed: it forgets old ones
  bool reconnect_ = false;
  std::atomic<bool> storeAway_{false};  // rideOut() runs: reports are kept at once
  std::mutex reportsMutex_;
  std::vector<Write> unsent_;  // reports the store did not take, oldest first
  std::mutex connectionMutex_;  // interrupt() against a reconnect swapping the connections
  bool interrupted_ = false;
  std::condition_variable interruptedCv_;  // rideOut()'s pauses end at interrupt()
  int joiningRound_ = -1;  // the round join() tries (-1: none yet)
  // This node gave up on its round through an outage: the next join() ends it, should another
  // member still be in it.
  bool endOwnRound_ = false;
};

}  // namespace dlrun::rendezvous
