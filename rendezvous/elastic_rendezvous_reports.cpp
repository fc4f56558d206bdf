// ElasticRendezvous's reports (elastic_rendezvous_impl.h): how a round ends from this node, over
// a connection of their own, and the hang reports the members share.
#include "rendezvous/elastic_rendezvous_impl.h"
#include "store/leasing_store.h"

namespace dlrun::rendezvous {

RoundEnd stopJob(Store& store, const elastic::Keys& keys, const RoundEnd& stop, int round) {
  // The job's stop first (the first stop wins, so every node reports the same one), then the
  // keys the others wait on: the end of `round`, and the newest round, where nodes may be
  // waiting for it to close.
  const RoundEnd first =
      elastic::decodeRoundEnd(store.compareSet(keys.stop(), "", elastic::encode(stop)));
  const int newest = static_cast<int>(store.add(keys.current(), 0));
  for (int r : {round, newest}) {
    if (r < 0) continue;
    store.compareSet(keys.closed(r), "", std::string(elastic::kStopped));
    store.compareSet(keys.end(r), "", elastic::encode(first));
  }
  return first;
}

namespace detail {

// Opened at the first report, not with the lease's: an agent that only joins and waits holds
// one connection to the store, so a store under a descriptor limit of 20,000 takes 12,500
// agents and more.
std::shared_ptr<LeasingStore> ElasticImpl::control() {
  {
    std::lock_guard lock(connectionMutex_);
    if (control_) return control_;
  }
  // Opened outside the lock: interrupt() must not wait for a connect.
  std::shared_ptr<LeasingStore> opened = openStore();
  std::lock_guard lock(connectionMutex_);
  if (!control_) control_ = std::move(opened);
  return control_;
}

// A report goes to this node's round only: a store that restarted without the job's keys may
// hold a round of that number that other nodes formed anew. (Its own assignment is read on the
// connection that writes: one connection never outlives the store's keys.)
bool ElasticImpl::stillMember(Store& store, int round) const {
  return store.check({keys_.assignment(round, memberId_)});
}

bool ElasticImpl::endRound(Store& store, int round, const RoundEnd& end) {
  if (!stillMember(store, round)) return false;
  const std::string mine = elastic::encode(end);
  if (store.compareSet(keys_.end(round), "", mine) != mine) return false;
  // Written after the round's end was deleted with its other keys (forgetRounds deletes the
  // assignments first): a late report gives a forgotten round no end; it is taken back.
  if (stillMember(store, round)) return true;
  store.deleteKey(keys_.end(round));
  return false;
}

// Raises the job's count of failure restarts to `count`, never lowers it (a report made again
// late must not undo a later failure's).
void raiseFailures(Store& store, const std::string& key, int count, std::string seen) {
  const std::string mine = std::to_string(count);
  for (int tries = 0; tries < 16; ++tries) {  // each lost try is another reporter's raise
    if (!seen.empty() && toCount(seen, key) >= count) return;
    const std::string now = store.compareSet(key, seen, mine);
    if (now == mine) return;
    seen = now == seen ? "" : now;  // the same back: the key is gone
  }
}

void ElasticImpl::reportFailure(RoundEnd failure) {
  failure.countFailure(member_->failures, options_.restarts);
  report(failure.describe(), [this, round = member_->round, failure](Store& store) {
    // The job's count, by the failure that ended the round (made again alike after a lost
    // reply). Every node that reads that end makes it too (readEnd): the report may never
    // get here (its end written, its reply lost, and the report made again only once the
    // round was forgotten; its node gone).
    if (endRound(store, round, failure)) raiseFailures(store, keys_.failures(), failure.failures);
  });
}

void ElasticImpl::reportSuccess() {
  const RoundEnd finished{.kind = RoundEnd::Kind::Finished, .node = options_.self.name};
  const int round = member_->round;
  std::vector<std::string> marks;
  for (int i = 1; i <= member_->members; ++i) marks.push_back(keys_.succeeded(round, i));
  // A report made again after its reply was lost adds twice: the count only says when to look,
  // the marks (each set before its ADD, so the last ADD finds them all) say whether all did.
  report("its workers finished",
         [this, round, mark = marks[member_->index - 1], marks, done = keys_.done(round),
          end = keys_.end(round), finished](Store& store) {
           if (!stillMember(store, round)) return;
           store.set(mark, "1");
           if (store.add(done, 1) >= static_cast<int64_t>(marks.size()) && store.check(marks))
             store.compareSet(end, "", elastic::encode(finished));
         });
}

RoundEnd ElasticImpl::reportStop(int signal) {
  const int round = memberRound_;
  if (options_.stopOnlyNode && round >= 0 && memberCount_ - 1 >= options_.minNodes) {
    // Leaving is a change of members: the others meet again without this node.
    const RoundEnd left = nodeLeft(elastic::nodeName(options_.self));
    control()->compareSet(keys_.end(round), "", elastic::encode(left));
    return left;
  }
  return stopJob(*control(), keys_, jobStopped(signal, options_.self.name), round);
}

void ElasticImpl::reportLost(const std::string& what) {
  const RoundEnd lost{.kind = RoundEnd::Kind::NodeLost, .node = what};
  report(lost.describe(),
         [this, round = member_->round, lost](Store& store) { endRound(store, round, lost); });
}

// One call on the kept connection; one that fails (the store restarted, a reply lost) is
// made once more on a new one.
template <typename Call>
auto ElasticImpl::onSharedStore(Call&& call) {
  std::lock_guard lock(sharedMutex_);
  for (int attempt = 0;; ++attempt) {
    try {
      if (!shared_) shared_ = openStore();
      return call(*shared_);
    } catch (const Error&) {
      shared_.reset();
      if (attempt > 0) throw;
    }
  }
}

void ElasticImpl::shareWithRound(RoundTopic topic, const std::string& text) {
  const int round = memberRound_;
  if (round < 0) return;
  const std::string key = keys_.shared(round, topic, memberIndex_);
  onSharedStore([&](LeasingStore& store) { store.set(key, text); });
}

std::vector<std::string> ElasticImpl::gatherFromRound(RoundTopic topic,
                                                      std::chrono::milliseconds timeout) {
  const int round = memberRound_;
  if (round < 0) return {};
  std::vector<std::string> keys;
  for (int i = 1; i <= memberCount_; ++i) keys.push_back(keys_.shared(round, topic, i));
  return onSharedStore([&](LeasingStore& store) {
    store.waitFor(keys, timeout);  // whatever came in time
    return store.peek(keys);
  });
}

}  // namespace detail
}  // namespace dlrun::rendezvous
