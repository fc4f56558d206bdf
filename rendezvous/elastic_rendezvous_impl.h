// ElasticRendezvous's inside (elastic_rendezvous.h): the joins and waits in
// elastic_rendezvous.cpp, a round's close and the forgetting of old ones in
// elastic_rendezvous_close.cpp, the reports in elastic_rendezvous_reports.cpp, a store's outage
// in elastic_rendezvous_outage.cpp; only those files include this.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <variant>

#include "common/clock.h"
#include "common/error.h"
#include "rendezvous/elastic_rendezvous.h"

namespace dlrun::rendezvous::detail {

// The join timeout's own error: it ends a join, where a store's TimeoutError is an outage.
class JoinTimedOut : public TimeoutError {
 public:
  using TimeoutError::TimeoutError;
};

// A count the protocol wrote: present, not negative, an int; ProtocolError naming `key` else.
int toCount(const std::string& text, const std::string& key);
// Raises the job's count of failure restarts at `key` to `count` (compare-and-set, never lower);
// `seen`: the count as last read, if it was (none: ""), which spares a write where it is as high.
void raiseFailures(Store& store, const std::string& key, int count, std::string seen = "");

class ElasticImpl {
 public:
  explicit ElasticImpl(ElasticOptions options);

  // ElasticRendezvous's calls, as elastic_rendezvous.h describes them.
  JoinResult next();
  RoundEnd awaitEnd();
  void reportFailure(RoundEnd failure);
  void reportSuccess();
  RoundEnd reportStop(int signal);
  void reportLost(const std::string& what);
  void shareWithRound(RoundTopic topic, const std::string& text);
  std::vector<std::string> gatherFromRound(RoundTopic topic, std::chrono::milliseconds timeout);
  void interrupt();
  void offerKept(std::optional<KeptWorkers> kept, std::function<void()> dropped) {
    kept_ = std::move(kept);
    keptDropped_ = std::move(dropped);
  }
  void whenSpare(std::function<void()> waiting) { spareWaiting_ = std::move(waiting); }

 private:
  // The workers offered are kept by no round of this join: the agent is told to stop them.
  void dropKept() {
    if (kept_ && keptDropped_) keptDropped_();
    kept_.reset();
  }
  // A store outage (elastic_rendezvous_outage.cpp). rideOut, after a call failed with
  // `failure`: waits until the store answers again (one line when it went, saying what goes
  // on `meanwhile`, one when it came back), opening a new connection where the failed one died
  // with its lease. Throws NetworkError once the store was away for storeOutage since its last
  // answer (`since`), or refused connections for a lease's TTL (the agent that served it has
  // exited: its message ends with `onGone`, what the caller does then), or on interrupt().
  void rideOut(const Error& failure, Clock::time_point since, const std::string& meanwhile,
               const std::string& onGone);
  // After a loss, a store that refuses connections (rather than a network that drops them) for
  // a lease's life is gone for good: the agent that served it has exited, and its keys with it.
  class Refusals {
   public:
    // Notes a try that failed at `at`; throws NetworkError naming `store` once every try was
    // refused for `ttl`, its message ending with `then`: what this node does next.
    void note(const Error& failure, Clock::time_point at, Clock::duration ttl,
              const std::string& store, const std::string& then);

   private:
    bool refusing_ = false;  // every try since since_ was refused
    Clock::time_point since_{};
  };
  static bool isOutage(const Error& error);
  // Waits `pause` on the store's clock; whether interrupt() came meanwhile.
  bool pauseInterrupted(std::chrono::milliseconds pause);
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
  // meanwhile, so that every node meets in the next one; workers kept for it are dropped.
  void abandonJoin(int round);
  // An end this node concluded itself (its round is gone from the store, or forgotten):
  // returned after marking the round for ending at the next join (endOwnRound_).
  RoundEnd endedHere(RoundEnd end);
  // This node's loss, as its lease's tripwire writes it.
  RoundEnd selfLost() const {
    return {.kind = RoundEnd::Kind::NodeLost, .node = elastic::nodeName(options_.self)};
  }
  using Write = std::function<void(Store&)>;
  // Makes a report now, or keeps it for replayReports() while the store is away.
  void report(const std::string& what, const Write& write);
  // Whether `store` still holds this node's assignment in `round`.
  bool stillMember(Store& store, int round) const;
  // Ends `round` as `end` unless it has an end, for a member of it; whether this end is the
  // round's (also when made again after a lost reply).
  bool endRound(Store& store, int round, const RoundEnd& end);
  void replayReports();

  struct Member {
    int round = 0;
    int index = 0;     // arrival index in the round
    int members = 0;   // the round's size
    int failures = 0;  // failure restarts used before the round
  };
  struct Ended {  // the last round this node saw end
    int round = 0;
    int members = 0;
    int spares = 0;  // agents that waited for a place in it
    RoundEnd::Kind kind{};
  };
  // What a round gave this node: a place, the job's end, or a reason to try the next round.
  struct NextRound {};
  using Step = std::variant<World, RoundEnd, NextRound>;

  void connect(Clock::time_point deadline);
  // next()'s one try: from the job's newest round (or the one after this node's) until it has
  // a place or the job's end.
  JoinResult join(Clock::time_point deadline);
  // How the job ended for a node that found its `stop` record: round `round`'s end where that
  // ended the job first, else the stop.
  RoundEnd stopOrEnd(const std::string& stop, int round);
  // ConfigError when the job's keys say it ended: from `stop`, the newest round (`current`;
  // round 0's end is `firstEnd`) and the job's Expiry.
  void refuseEndedJob(const std::string& stop, const std::string& current,
                      const std::string& firstEnd, const std::string& expiry);
  std::unique_ptr<LeasingStore> openStore() const;
  // The c10d store's numeric host as the last connection found it (its name resolved again at
  // each), for the round's workers; the launch's address before the first.
  std::string storeAddress() const;
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
  // Round `round`'s end, once its wait said it is set; nothing when the round was forgotten
  // since.
  std::optional<RoundEnd> readEnd(int round);
  // The join timeout's error, naming the last round's members that did not come back.
  JoinTimedOut timedOut(int round);
  // Throws timedOut(round), after releasing this node's record `index` (0: none) in it.
  [[noreturn]] void giveUpJoin(int round, int index);
  int spares(int round);
  int targetSize(int round) const;
  // Moves the newest round on to `toRound`; returns the round to join: `toRound`, or the
  // newer one the store names.
  int advanceCurrent(int toRound);
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
  std::unique_ptr<LeasingStore> lease_;  // joins, waits and this node's lease
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
  std::optional<KeptWorkers> kept_;     // offered to the join under way (offerKept)
  std::function<void()> spareWaiting_;  // whenSpare's
  std::function<void()> keptDropped_;
  std::optional<int> closedRound_;  // the last round this node closed: it forgets old ones
  bool reconnect_ = false;
  std::atomic<bool> storeAway_{false};  // rideOut() runs: reports are kept at once
  std::mutex reportsMutex_;
  // shareWithRound's and gatherFromRound's connection, kept from one call to the next (a round's
  // probe would otherwise cost the store a few connections a node), used by one call at a time.
  std::mutex sharedMutex_;
  std::unique_ptr<LeasingStore> shared_;
  template <typename Call>
  auto onSharedStore(Call&& call);
  std::vector<Write> unsent_;   // reports the store did not take, oldest first
  std::mutex connectionMutex_;  // interrupt() against a reconnect swapping the connections
  bool interrupted_ = false;
  std::condition_variable interruptedCv_;  // rideOut()'s pauses end at interrupt()
  int joiningRound_ = -1;                  // the round join() tries (-1: none yet)
  // The store's last answer to a join's wait: an outage that cuts the join counts from it, not
  // from the join's start (a spare waits as long as the job runs).
  Clock::time_point answered_{};
  mutable std::mutex storeAddressMutex_;  // openStore() runs on the agent's thread too
  mutable std::string storeAddress_;      // set by openStore() where the store has a name
  // This node gave up on its round through an outage: the next join() ends it, should another
  // member still be in it.
  bool endOwnRound_ = false;
};

}  // namespace dlrun::rendezvous::detail
