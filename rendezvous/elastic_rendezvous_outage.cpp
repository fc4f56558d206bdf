// ElasticRendezvous (elastic_rendezvous_impl.h) through an outage of its store (ARCHITECTURE.md
// section 4): a store that stops answering is not a lost node. The workers keep running and the
// agent keeps trying; once the store answers, a round it still holds intact goes on with no
// restart, and the nodes it lost (their leases lapsed meanwhile) end it as they always do. Only
// what needs the store waits: a join, and the reports, which are kept and made again once it
// answers.
#include <algorithm>
#include <sstream>

#include "common/log.h"
#include "rendezvous/elastic_rendezvous_impl.h"
#include "store/leasing_store.h"
#include "store/tcp_stream.h"

namespace dlrun::rendezvous::detail {

namespace {

std::string seconds(Clock::duration elapsed) {
  std::ostringstream out;
  out.precision(1);
  out << std::fixed << std::chrono::duration<double>(elapsed).count();
  return out.str();
}

}  // namespace

void ElasticImpl::Refusals::note(const Error& failure, Clock::time_point at, Clock::duration ttl,
                                 const std::string& store, const std::string& then) {
  const bool refused = dynamic_cast<const ConnectionRefused*>(&failure) != nullptr;
  if (refused && !refusing_) since_ = at;
  refusing_ = refused;
  if (refusing_ && at - since_ >= ttl)
    throw NetworkError("the rendezvous store at " + store +
                       " is gone (connection refused): the agent that served it has exited; " +
                       then);
}

bool ElasticImpl::isOutage(const Error& error) {
  // A peer that speaks something else, or a bad configuration, will not mend by waiting.
  return !dynamic_cast<const ProtocolError*>(&error) && !dynamic_cast<const ConfigError*>(&error);
}

void ElasticImpl::reopen() {
  auto opened = openStore();
  std::lock_guard lock(connectionMutex_);
  if (interrupted_) throw NetworkError("the rendezvous was interrupted");
  lease_ = std::move(opened);
  control_.reset();  // the next report opens its own
}

void ElasticImpl::rideOut(const Error& failure, Clock::time_point since,
                          const std::string& meanwhile, const std::string& onGone) {
  {
    std::lock_guard lock(connectionMutex_);  // interrupt() cut the call: no outage
    if (interrupted_) throw NetworkError("the rendezvous was interrupted");
  }
  storeAway_ = true;
  struct Back {
    std::atomic<bool>& away;
    ~Back() { away = false; }
  } back{storeAway_};
  log::warn("the rendezvous store at " + storeName() + " stopped answering " +
            seconds(now() - since) + " s ago (" + failure.what() + "); " + meanwhile +
            " while it is away, for up to " + seconds(options_.storeOutage) +
            " s (store_outage_timeout)");
  Refusals refusals;
  for (auto pause = std::chrono::milliseconds(50);;
       pause = std::min<std::chrono::milliseconds>(pause * 2, options_.heartbeat)) {
    try {
      // A connection that died with its lease is no use again (dlrund's); etcd's is.
      if (!lease_->outlivesFailures()) reopen();
      lease_->peek({keys_.shape()});
      log::info("the rendezvous store at " + storeName() + " answers again after " +
                seconds(now() - since) + " s");
      return;
    } catch (const Error& e) {
      // A store stopped (SIGSTOP) or overloaded accepts and says nothing: it was a store.
      if (!isOutage(e) && !dynamic_cast<const NotAStoreError*>(&e)) throw;
      const auto at = now();
      refusals.note(e, at, options_.leaseTtl, storeName(), onGone);
      if (at - since >= options_.storeOutage)
        throw NetworkError("the rendezvous store at " + storeName() + " did not answer for " +
                           seconds(at - since) + " s (store_outage_timeout): " + e.what());
    }
    if (pauseInterrupted(pause)) throw NetworkError("the rendezvous was interrupted");
  }
}

bool ElasticImpl::pauseInterrupted(std::chrono::milliseconds pause) {
  const auto* opener = std::get_if<StoreOpener>(&options_.store);
  if (opener && opener->pause) {
    opener->pause(pause);  // a simulated store's time
    std::lock_guard lock(connectionMutex_);
    return interrupted_;
  }
  std::unique_lock lock(connectionMutex_);
  return interrupted_ || interruptedCv_.wait_for(lock, pause, [this] { return interrupted_; });
}

bool ElasticImpl::restoreIfReset(int round) {
  const auto found = lease_->peek({keys_.shape(), keys_.current()});
  if (!found[0].empty() && !found[1].empty()) return false;
  restoreAfterReset(round);
  return true;
}

int ElasticImpl::restoreAfterReset(int round) {
  lease_->compareSet(
      keys_.shape(), "",
      elastic::encodeShape({.minNodes = options_.minNodes, .maxNodes = options_.maxNodes}));
  // A node that arrived since may have written a round already: the nodes meet in that one.
  const std::string current = lease_->compareSet(keys_.current(), "", std::to_string(round));
  log::warn("the rendezvous store at " + storeName() +
            " came back without this job's keys (it restarted and lost them): the nodes meet "
            "again in round " +
            current);
  return static_cast<int>(storedCount(current, keys_.current()));
}

std::optional<RoundEnd> ElasticImpl::roundAfterOutage(int round) {
  const auto found =
      lease_->peek({keys_.closed(round), keys_.forgotten(), keys_.assignment(round, memberId_)});
  if (!found[1].empty() && storedCount(found[1], keys_.forgotten()) >= round) {
    // Its lease lapsed, its round ended, and two more rounds went by: it is no member now.
    return selfLost();
  }
  // Its own assignment says the round is the one it knew, not one of that number that nodes
  // formed anew in a store that restarted without the job's keys.
  if (found[0] == std::to_string(member_->members) && !found[2].empty()) return std::nullopt;
  // The round as this node knew it is gone: the store lost it (another node may have written
  // the job's first keys again already).
  restoreIfReset(round + 1);
  return RoundEnd{.kind = RoundEnd::Kind::StoreLost,
                  .node = "the rendezvous store at " + storeName() + " came back without round " +
                          std::to_string(round) + " (it restarted and lost its keys)"};
}

void ElasticImpl::abandonJoin(int round) {
  // Workers kept for this join are kept by no later one: the outage may have been the store's
  // restart without the job's keys (their meeting's keys gone with it, and another node may
  // have written the job's first keys again: nothing here tells), this node's lease may have
  // lapsed (the others took it for lost, its ranks going to another node), or the round
  // closed without it or with it (below). A whole-group restart for a fault during a keep.
  dropKept();
  const std::string closed =
      lease_->compareSet(keys_.closed(round), "", std::string(elastic::kAborted));
  if (closed == elastic::kAborted || closed == elastic::kStopped) return;
  // It closed meanwhile. With this node a member that never learnt its place, the round ends:
  // every node meets in the next one.
  if (!lease_->peek({keys_.assignment(round, memberId_)})[0].empty())
    lease_->compareSet(keys_.end(round), "", elastic::encode(selfLost()));
}

void ElasticImpl::report(const std::string& what, const Write& write) {
  if (!storeAway_) {
    try {
      write(*control());
      return;
    } catch (const Error& e) {
      if (!isOutage(e)) throw;
      std::lock_guard lock(connectionMutex_);
      control_.reset();  // the next report opens a new one
    }
  }
  log::info("the rendezvous store does not answer: this node's report (" + what +
            ") is made once it does");
  std::lock_guard lock(reportsMutex_);
  unsent_.push_back(write);
}

void ElasticImpl::replayReports() {
  std::vector<Write> unsent;
  {
    std::lock_guard lock(reportsMutex_);
    if (unsent_.empty()) return;
    unsent.swap(unsent_);
  }
  for (size_t i = 0; i < unsent.size(); ++i) {
    try {
      unsent[i](*lease_);
    } catch (...) {
      std::lock_guard lock(reportsMutex_);  // kept, in order, for the next try
      unsent_.insert(unsent_.begin(), unsent.begin() + static_cast<long>(i), unsent.end());
      throw;
    }
  }
}

}  // namespace dlrun::rendezvous::detail
