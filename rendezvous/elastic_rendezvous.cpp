#include "rendezvous/elastic_rendezvous_impl.h"

#include <algorithm>
#include <ctime>
#include <limits>
#include <random>
#include <sstream>
#include <utility>

#include "common/clock.h"
#include "common/error.h"
#include "common/host_port.h"
#include "common/log.h"
#include "rendezvous/waiting_report.h"
#include "store/address.h"
#include "store/leasing_store.h"
#include "store/tcp_store.h"
#include "store/tcp_stream.h"

namespace dlrun::rendezvous {

namespace {

std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream out;
  out << ms.count() / 1000.0;
  return out.str();
}

// 64 random bits in hex: two agents of one job (which may share a host name) never share one.
std::string newMemberId() {
  std::random_device random;
  std::ostringstream id;
  id << std::hex << random() << random();
  return id.str();
}

}  // namespace

namespace detail {

int toCount(const std::string& text, const std::string& key) {
  const int64_t value = text.empty() ? -1 : storedCount(text, key);
  if (value < 0 || value > std::numeric_limits<int>::max())
    throw ProtocolError("malformed value '" + text + "' under " + key + " in the store");
  return static_cast<int>(value);
}

ElasticImpl::ElasticImpl(ElasticOptions options)
    : options_(std::move(options)),
      keys_(options_.runId),
      memberId_(options_.memberId.empty() ? newMemberId() : options_.memberId) {
  connect(now() + options_.joinTimeout);
  lookFirst();
}

Clock::time_point ElasticImpl::now() const {
  // Before the first connection there is no store to ask; only connect() runs then.
  if (lease_) return lease_->now();
  const auto* opener = std::get_if<StoreOpener>(&options_.store);
  return opener && opener->now ? opener->now() : Clock::now();
}

std::unique_ptr<LeasingStore> ElasticImpl::openStore() const {
  if (const auto* opener = std::get_if<StoreOpener>(&options_.store)) return opener->open();
  HostPort store = std::get<HostPort>(options_.store);
  if (!store.address.empty()) {
    // Each connection resolves the name again: a store that moved is followed. A name that
    // does not resolve this moment (its pod being replaced) leaves the last address.
    try {
      store.address = resolveNumeric(store.host, "the rendezvous store's host");
    } catch (const NetworkError&) {
      store.address = storeAddress();
    }
    std::lock_guard lock(storeAddressMutex_);
    storeAddress_ = store.address;
  }
  return std::make_unique<TcpStore>(TcpStoreOptions{
      .at = std::move(store),
      // A store that does not answer within a lease's life is as good as gone.
      .timeout = options_.leaseTtl + options_.heartbeat,
      // Short tries, so an interrupt() between them is seen within a heartbeat.
      .connectTimeout = options_.heartbeat,
      .reconnect = false,  // a silent reconnect would drop this connection's lease
  });
}

std::string ElasticImpl::storeAddress() const {
  std::lock_guard lock(storeAddressMutex_);
  if (!storeAddress_.empty()) return storeAddress_;
  const auto* store = std::get_if<HostPort>(&options_.store);
  return store ? store->socketHost() : "";
}

void ElasticImpl::connect(Clock::time_point deadline) {
  Refusals refusals;
  std::optional<Clock::time_point> silentSince;
  while (true) {
    try {
      auto lease = openStore();
      // On etcd the lease's grant goes on from here, alongside the first look and the join.
      lease->prepareLease(options_.leaseTtl);
      std::lock_guard lock(connectionMutex_);
      if (interrupted_) throw NetworkError("the rendezvous was interrupted");
      lease_ = std::move(lease);
      control_.reset();  // the next report opens its own
      reconnect_ = false;
      return;
    } catch (const Error& e) {
      const auto at = now();
      // A node reconnecting to a store it reached before may find it stopped or overloaded,
      // saying nothing a while: that is waited for up to store_outage_timeout, then reported as
      // away. At first contact a server that says nothing is named at once as not a store (a
      // wrong endpoint is far likelier than a store stopped just then). One that answers
      // something else, or a broken one, will not become a store.
      const bool silent = reconnect_ && dynamic_cast<const SilentServerError*>(&e) != nullptr;
      if (!silent) silentSince.reset();
      if (silent && !silentSince) silentSince = at;
      if (!isOutage(e) && !silent) throw;
      // Silent for longer: a store away too long, as it is to a node already in the job.
      if (silent && at - *silentSince >= options_.storeOutage)
        throw NetworkError(
            "the rendezvous store at " + storeName() + " did not answer for " +
            std::to_string(
                std::chrono::duration_cast<std::chrono::seconds>(at - *silentSince).count()) +
            " s (store_outage_timeout): " + e.what());
      if (reconnect_) refusals.note(e, at, options_.leaseTtl, storeName(), "this node gives up");
      std::lock_guard lock(connectionMutex_);
      if (interrupted_ || at >= deadline)
        throw NetworkError("cannot reach the rendezvous store at " + storeName() + ": " + e.what());
    }
  }
}

std::string ElasticImpl::storeName() const {
  if (const auto* opener = std::get_if<StoreOpener>(&options_.store)) return opener->name;
  return std::get<HostPort>(options_.store).text();
}

void ElasticImpl::lookFirst() {
  // Read first: all but the first node find the shape, and a read costs etcd no log entry.
  std::vector<std::string> found =
      lease_->peek({keys_.shape(), keys_.end(0), keys_.stop(), keys_.lost(options_.self.name),
                    keys_.current(), keys_.expiry()});
  if (!options_.endedJobKeys.empty()) refuseEndedJob(found[2], found[4], found[1], found[5]);
  const elastic::Shape mine{.minNodes = options_.minNodes, .maxNodes = options_.maxNodes};
  std::string stored = found[0];
  if (stored.empty()) stored = lease_->compareSet(keys_.shape(), "", elastic::encodeShape(mine));
  const elastic::Shape theirs = elastic::decodeShape(stored);
  if (theirs.protocol != mine.protocol)
    throw ConfigError("job '" + options_.runId +
                      "' was started by a dlrun that speaks rendezvous "
                      "protocol " +
                      std::to_string(theirs.protocol) + ", and this one speaks " +
                      std::to_string(mine.protocol) +
                      ": run the same dlrun version on every node of a job");
  const auto range = [](const elastic::Shape& s) {
    return std::to_string(s.minNodes) + ":" + std::to_string(s.maxNodes);
  };
  if (theirs != mine)
    throw ConfigError(
        "rendezvous id '" + options_.runId + "' is in use by a job with --nnodes=" + range(theirs) +
        " (this node has --nnodes=" + range(mine) + "); give each job its own --rdzv-id");
  firstLook_.emplace(found.begin() + 2, found.begin() + 5);
}

void ElasticImpl::refuseEndedJob(const std::string& stop, const std::string& current,
                                 const std::string& firstEnd, const std::string& expiry) {
  const int64_t round = storedCount(current, keys_.current());
  const std::string newestEnd =
      round > 0 ? lease_->peek({keys_.end(static_cast<int>(round))})[0] : firstEnd;
  const auto end = elastic::endedJob(stop, newestEnd);
  if (!end) return;
  const std::string what = "rendezvous id '" + options_.runId + "' names a job that ";
  // Its agents lease its keys as they leave (expiry), so the id frees once they expire; before
  // the first agent left, or when none did (all killed), they stay.
  if (auto expires = elastic::decodeExpiry(expiry))
    throw ConfigError(what + elastic::describe(*expires, std::time(nullptr), end->describe()) +
                      ": give each job its own --rdzv-id, or wait");
  throw ConfigError(what + "already ended (" + end->describe() + "); its keys stay in " +
                    options_.endedJobKeys + ": give each job its own --rdzv-id");
}

JoinResult ElasticImpl::next() {
  const auto deadline = now() + options_.joinTimeout;
  if (reconnect_) {
    log::info("reconnecting to the rendezvous store at " + storeName());
    connect(deadline);
  }
  {
    std::lock_guard lock(reportsMutex_);
    unsent_.clear();  // the last round's, which ended without them
  }
  std::optional<int> abandoned;  // a join the store's outage cut short, not yet given up
  while (true) {
    joiningRound_ = -1;
    answered_ = now();
    try {
      // Given up in the store once it answers: a failure meanwhile is an outage like any other.
      if (abandoned) {
        restoreIfReset(*abandoned + 1);
        abandonJoin(*abandoned);
        abandoned.reset();
      }
      return join(deadline);
    } catch (const JoinTimedOut&) {
      throw;
    } catch (const Error& e) {
      // Past the join timeout too: a spare waits as long as the job runs, and a join that ends
      // below the minimum times out once the store answers again.
      if (!isOutage(e)) throw;
      if (joiningRound_ >= 0) abandoned = joiningRound_;
      rideOut(e, answered_, "this node's join waits", "this node gives up its join");
    }
  }
}

RoundEnd ElasticImpl::stopOrEnd(const std::string& stop, int round) {
  // A stop that came once the job had ended already (a final failure, or its finish) changes
  // nothing: the members read that end, and so does every other node. Where the round has no
  // end yet, this node writes the stop there, as the stopper does (the first writer wins): a
  // finish written after a mere look would be the other nodes' outcome, not this one's.
  if (round >= 0) {
    RoundEnd end = elastic::decodeRoundEnd(lease_->compareSet(keys_.end(round), "", stop));
    if (end.endsJob()) return end;
  }
  return elastic::decodeRoundEnd(stop);
}

JoinResult ElasticImpl::join(Clock::time_point deadline) {
  // The newest round is read with the rest; only the job's first agent finds it missing and
  // creates it (an add of 0). The first time, lookFirst() read them already.
  const auto found =
      firstLook_ ? *std::exchange(firstLook_, std::nullopt)
                 : lease_->peek({keys_.stop(), keys_.lost(options_.self.name), keys_.current()});
  if (!found[0].empty()) {  // stopped on purpose
    const int newest = found[2].empty() ? -1 : toCount(found[2], keys_.current());
    return stopOrEnd(found[0], newest);
  }
  // The mark names the agent whose lease lapsed: this very agent was only slow (a stall of the
  // store or of this node lapses a live agent's lease too), and is taken back.
  if (options_.refuseLostNodes && !found[1].empty() && found[1] != memberId_)
    throw ConfigError("node " + options_.self.name + " was lost earlier in job '" + options_.runId +
                      "' and is not taken back: its place went to another node");
  int round;
  if (member_) {
    if (endOwnRound_) {
      lease_->compareSet(keys_.end(member_->round), "", elastic::encode(selfLost()));
      endOwnRound_ = false;
    }
    // Released without firing: this node leaves the old round on purpose.
    lease_->deleteKey(keys_.node(member_->round, member_->index));
    // The round after its own, or a newer one where it slept through some (a lost node). A
    // store that names an older round, or none, restarted without the job's keys.
    const int stored = found[2].empty() ? -1 : toCount(found[2], keys_.current());
    round = stored >= member_->round ? std::max(member_->round + 1, stored)
                                     : restoreAfterReset(member_->round + 1);
    member_.reset();
    memberRound_ = -1;
  } else {
    round = found[2].empty() ? static_cast<int>(lease_->add(keys_.current(), 0))
                             : toCount(found[2], keys_.current());
  }
  for (;; ++round) {
    round = advanceCurrent(round);
    joiningRound_ = round;
    Step step = tryRound(round, deadline);
    if (auto* world = std::get_if<World>(&step)) return *world;
    if (auto* end = std::get_if<RoundEnd>(&step)) return *end;
  }
}

int ElasticImpl::advanceCurrent(int toRound) {
  if (toRound == 0) return 0;
  const std::string stored =
      lease_->compareSet(keys_.current(), std::to_string(toRound - 1), std::to_string(toRound));
  // The job went on without this node (it was stopped through rounds that are forgotten now):
  // it joins the newest round, never an old one again.
  const int current = stored.empty() ? toRound : toCount(stored, keys_.current());
  return std::max(toRound, current);
}

int ElasticImpl::targetSize(int round) const {
  // After a round ends its members come back, less a lost node, plus a node that asked to join
  // and the spares that waited: close as soon as that many have, not after the last call.
  if (!ended_ || ended_->round != round - 1) return options_.maxNodes;
  using Kind = RoundEnd::Kind;
  const int expected = ended_->members + ended_->spares +
                       (ended_->kind == Kind::NodeJoined ? 1 : 0) -
                       (ended_->kind == Kind::NodeLost || ended_->kind == Kind::NodeLeft ? 1 : 0);
  return std::clamp(expected, options_.minNodes, options_.maxNodes);
}

bool ElasticImpl::waitChunk(const std::string& key) {
  const bool set = lease_->waitFor({key}, options_.heartbeat);
  answered_ = now();
  return set;
}

ElasticImpl::Step ElasticImpl::tryRound(int round, Clock::time_point deadline) {
  // What this node waits for and reads next, followed from before it joins (a hint; on etcd a
  // watch read with the join below, so the waits and reads after it cost no request): the
  // round's close and end, its assignment (keyed by its id, so known before its arrival
  // index) and the roster.
  std::vector<std::string> next{keys_.closed(round), keys_.end(round),
                                keys_.assignment(round, memberId_)};
  if (options_.fetchRoster) next.push_back(keys_.roster(round));
  lease_->expect(next);
  elastic::NodeRecord record = options_.self;
  record.id = memberId_;
  record.failures = failures_;
  record.lastGroupRank = lastGroupRank_;
  record.kept = kept_;
  record.workerPorts = kept_                  ? kept_->workerPorts
                       : options_.workerPorts ? options_.workerPorts(record.addr, record.nproc)
                                              : reserveFreePorts(record.addr, record.nproc);
  const RoundEnd lost = selfLost();
  // The join, and the leased record of each of the first maxNodes arrivals: one request on
  // etcd, where the record's key follows from the arrival index the join gives.
  const int index = static_cast<int>(lease_->addThenLease(
      keys_.joined(round), options_.maxNodes,
      [&](int64_t arrival) { return keys_.node(round, static_cast<int>(arrival)); },
      elastic::encode(record), options_.leaseTtl,
      {{keys_.closed(round), std::string(elastic::kAborted)},
       {keys_.end(round), elastic::encode(lost)},
       {keys_.lost(record.name), memberId_}}));
  const bool candidate = index <= options_.maxNodes;
  const auto arrival = now();
  const bool canClose = candidate && index >= options_.minNodes;
  // What a member reads once the round closed: the closer knows it already.
  std::optional<std::vector<std::string>> texts;
  if (canClose && index >= targetSize(round)) {
    texts = closeRound(round, index);
  }
  WaitingReport waiting(options_.minNodes);
  while (!texts && !waitChunk(keys_.closed(round))) {
    if (canClose && now() - arrival >= options_.lastCall) {
      texts = closeRound(round, index);
    } else if (now() >= deadline) {
      // The closer may have read this node's record already: the round is aborted first, so
      // that it never closes with a member that left, unless it closed meanwhile, and then
      // this node is in it after all.
      if (candidate && lease_->compareSet(keys_.closed(round), "",
                                          std::string(elastic::kAborted)) != elastic::kAborted)
        break;
      giveUpJoin(round, candidate ? index : 0);
    } else if (!canClose) {
      // One read a heartbeat: whether the round was forgotten or a newer one opened (the
      // store restarted without the job's keys and this node named this round anew, while
      // the others, members of the old one, went past it: nobody else comes), the job's stop
      // (one written after this node's first look, while the stopper read an older round as
      // the newest, reaches it here or through the closer), and who joined.
      const auto found =
          lease_->peek({keys_.forgotten(), keys_.stop(), keys_.joined(round), keys_.current()});
      if ((!found[0].empty() && toCount(found[0], keys_.forgotten()) >= round) ||
          (!found[3].empty() && toCount(found[3], keys_.current()) > round)) {
        if (candidate) lease_->deleteKey(keys_.node(round, index));
        return NextRound{};
      }
      if (!found[1].empty()) {
        if (candidate) lease_->deleteKey(keys_.node(round, index));
        return stopOrEnd(found[1], round);
      }
      const int joined = found[2].empty() ? 0 : toCount(found[2], keys_.joined(round));
      if (auto line = waiting.update(joined, now(), deadline)) log::info(*line);
    }
  }
  if (!texts) {
    // One read whatever the outcome: a missing assignment reads as empty.
    std::vector<std::string> keys{keys_.closed(round), keys_.assignment(round, memberId_)};
    if (options_.fetchRoster) keys.push_back(keys_.roster(round));
    texts = lease_->peek(keys);
  }
  const std::string& closed = (*texts)[0];
  // Closed, then forgotten two rounds later while this node was stopped or starved between
  // its wait's answer and this read: it meets the others in a newer round.
  if (closed.empty() || closed == elastic::kAborted || closed == elastic::kStopped) {
    // Aborted by a node that gave up as this one's time ran out too: both give up in this
    // round, each naming the nodes that did not come.
    if (closed == elastic::kAborted && now() >= deadline) giveUpJoin(round, candidate ? index : 0);
    if (candidate) lease_->deleteKey(keys_.node(round, index));
    if (closed == elastic::kStopped) return stopOrEnd(lease_->peek({keys_.stop()})[0], round);
    return NextRound{};
  }
  const int members = toCount(closed, keys_.closed(round));
  if (candidate && index <= members) {
    World world = memberWorld(round, index, members, *texts);
    if (options_.restarts.allowsRestart(world.failures)) return world;
    // The job failed for good already, and the store restarted without that round's end
    // before every node read it: the round ends at once, the same way for every member.
    RoundEnd failed{
        .kind = RoundEnd::Kind::WorkerFailed,
        .exitCode = 1,
        .failures = world.failures,
        .final = true,
        .report = "dlrun: the job failed for good (failure " + std::to_string(world.failures) +
                  " with --max-restarts=" + std::to_string(options_.restarts.maxRestarts) +
                  ") before its rendezvous store restarted and lost the report\n"};
    lease_->compareSet(keys_.end(round), "", elastic::encode(failed));
    return elastic::decodeRoundEnd(lease_->peek({keys_.end(round)})[0]);
  }
  if (candidate) lease_->deleteKey(keys_.node(round, index));
  return afterLateArrival(round, members);
}

World ElasticImpl::memberWorld(int round, int index, int members,
                               const std::vector<std::string>& texts) {
  const elastic::Assignment a = elastic::decodeAssignment(texts[1]);
  member_ = Member{round, index, members, a.failures};
  memberRound_ = round;
  memberCount_ = members;
  memberIndex_ = index;
  lastRound_ = round;
  lastGroupRank_ = a.groupRank;
  failures_ = a.failures;
  // Over another kind of store (etcd) the round names the workers' store.
  const auto* store = std::get_if<HostPort>(&options_.store);
  const NodeJob job{options_.runId, options_.self.nproc, options_.restarts,
                    store ? HostPort{storeAddress(), store->port} : HostPort{}};
  elastic::Roster roster;
  if (options_.fetchRoster) roster = elastic::decodeRoster(texts[2]);
  World world = makeWorld(job, round, a, std::move(roster.endpoints));
  world.workerRoles = std::move(roster.roles);
  return world;
}

std::optional<RoundEnd> ElasticImpl::readEnd(int round) {
  const auto found = lease_->peek({keys_.end(round), keys_.failures(), keys_.forgotten()});
  const std::string& text = found[0];
  // Its end came, then went with the round's other keys two rounds later (forgetRounds),
  // while this node was stopped or starved between its wait's answer and this read: only
  // forgetting deletes an end, and the same connection cannot outlive a store that lost its
  // keys. An end of a round already forgotten is a late report's, about to be taken back
  // (endRound): the round's own end went with its keys.
  if (text.empty() || (!found[2].empty() && toCount(found[2], keys_.forgotten()) >= round))
    return std::nullopt;
  RoundEnd end = elastic::decodeRoundEnd(text);
  if (end.countsAsFailure()) {
    failures_ = end.failures;
    // The job's count, where the failure's report wrote the end and not the count: a node
    // that closes a later round alone (a spare) reads it there.
    raiseFailures(*lease_, keys_.failures(), end.failures, found[1]);
  }
  return end;
}

RoundEnd ElasticImpl::endedHere(RoundEnd end) {
  // The store may hold another round of this number (formed anew where it lost its keys), or
  // none: the next join ends it, so no node stays in it while this one goes to the next.
  endOwnRound_ = true;
  return end;
}

RoundEnd ElasticImpl::awaitEnd() {
  const int round = member_->round;
  // The closer tidies up while its workers run, off everyone's way into the round.
  bool tidy = closedRound_ == round;
  bool wasAway = false;
  auto last = now();  // the store's last answer
  while (true) {
    try {
      // What became of the round while the store was away (a store that fails again meanwhile
      // is ridden out again, its outage still counted from `last`).
      if (wasAway)
        if (auto end = roundAfterOutage(round)) return endedHere(*end);
      wasAway = false;
      if (std::exchange(tidy, false)) forgetRounds(round - 2);
      replayReports();
      // A member slow to begin waiting (it tidied, or was stopped a while), or one that learnt
      // its place in a round the others left long ago (stopped as the round closed), may find
      // its round over and forgotten: two rounds went by without it, and its end is gone. One
      // look a round. `last` is taken before it: a stop right after it counts in the wait's
      // first piece.
      last = now();
      if (forgotten(round)) return endedHere(selfLost());
      while (!waitChunk(keys_.end(round))) {
        replayReports();
        // Stopped (SIGSTOP) or starved long enough for its lease to lapse (on etcd, renewed a
        // third of a TTL apart, after two thirds), this node was lost, and its round's keys
        // may have gone with two later rounds: it must not wait on them for ever. A wait's own
        // piece takes a heartbeat.
        const auto at = now();
        if (at - last > options_.heartbeat + options_.leaseTtl / 4)
          if (auto end = roundAfterOutage(round)) return endedHere(*end);
        last = at;
      }
      // A report the store took but whose reply was lost is made again even so: the failure
      // it carries is the job's count (the failures key).
      replayReports();
      const std::optional<RoundEnd> end = readEnd(round);
      if (!end) return endedHere(selfLost());  // it slept through two rounds
      ended_ = Ended{round, member_->members, spares(round), end->kind};
      return *end;
    } catch (const Error& e) {
      if (!isOutage(e)) throw;
      try {
        rideOut(e, last, "the workers keep running",
                "the round ends: this node stops its workers and reconnects");
        wasAway = true;
      } catch (const Error& gone) {
        if (!isOutage(gone)) throw;
        reconnect_ = true;
        endOwnRound_ = true;  // for any member still in it, once the store answers
        return RoundEnd{.kind = RoundEnd::Kind::StoreLost, .node = gone.what()};
      }
    }
  }
}

void ElasticImpl::giveUpJoin(int round, int index) {
  const JoinTimedOut error = timedOut(round);
  if (index > 0) lease_->deleteKey(keys_.node(round, index));
  throw error;
}

JoinTimedOut ElasticImpl::timedOut(int round) {
  // Said before this node's record goes, so a node that gives up at the same moment finds it
  // in one list or the other.
  lease_->append(keys_.gaveUp(round), elastic::nodeName(options_.self) + "\n");
  const int joined = static_cast<int>(lease_->add(keys_.joined(round), 0));
  std::string message = "rendezvous '" + options_.runId + "' gave up after " +
                        seconds(options_.joinTimeout) +
                        " s (join_timeout): " + std::to_string(joined) + " of at least " +
                        std::to_string(options_.minNodes) + " nodes joined";
  std::vector<std::string> records;
  for (int i = 1; i <= std::min(joined, options_.maxNodes); ++i)
    records.push_back(keys_.node(round, i));
  records.push_back(keys_.gaveUp(round));
  // The last round's names are O(N) bytes: read only here, never on the way into a round.
  // (Before this node's first round closed, the key does not exist: nobody is expected.)
  records.push_back(keys_.names(lastRound_.value_or(round)));
  std::vector<std::string> texts = lease_->peek(records);
  const std::vector<std::string> expected = texts.back().empty()
                                                ? std::vector<std::string>{}
                                                : elastic::decodeRoster(texts.back()).endpoints;
  texts.pop_back();
  std::vector<std::string> came;
  for (size_t start = 0, end; (end = texts.back().find('\n', start)) != std::string::npos;
       start = end + 1)
    came.push_back(texts.back().substr(start, end - start));
  texts.pop_back();
  for (const auto& text : texts) {
    if (!text.empty()) came.push_back(elastic::nodeName(elastic::decodeNodeRecord(text)));
  }
  const auto missing = missingNodes(expected, came);
  for (size_t i = 0; i < missing.size(); ++i)
    message += (i == 0 ? "; nodes that did not come back: " : ", ") + missing[i];
  return JoinTimedOut(message);
}

void ElasticImpl::interrupt() {
  std::lock_guard lock(connectionMutex_);
  interrupted_ = true;
  interruptedCv_.notify_all();
  if (lease_) lease_->abort();
}

}  // namespace detail

ElasticRendezvous::ElasticRendezvous(ElasticOptions options)
    : impl_(std::make_unique<detail::ElasticImpl>(std::move(options))) {}
ElasticRendezvous::~ElasticRendezvous() = default;
JoinResult ElasticRendezvous::next() {
  JoinResult joined = impl_->next();
  impl_->offerKept(std::nullopt, nullptr);
  return joined;
}
void ElasticRendezvous::offerKept(const KeptWorkers& kept, std::function<void()> dropped) {
  impl_->offerKept(kept, std::move(dropped));
}
void ElasticRendezvous::whenSpare(std::function<void()> waiting) {
  impl_->whenSpare(std::move(waiting));
}
RoundEnd ElasticRendezvous::awaitEnd() { return impl_->awaitEnd(); }
void ElasticRendezvous::reportFailure(RoundEnd failure) {
  impl_->reportFailure(std::move(failure));
}
void ElasticRendezvous::reportSuccess() { impl_->reportSuccess(); }
RoundEnd ElasticRendezvous::reportStop(int signal) { return impl_->reportStop(signal); }
void ElasticRendezvous::reportLost(const std::string& what) { impl_->reportLost(what); }
void ElasticRendezvous::shareWithRound(RoundTopic topic, const std::string& text) {
  impl_->shareWithRound(topic, text);
}
std::vector<std::string> ElasticRendezvous::gatherFromRound(RoundTopic topic,
                                                            std::chrono::milliseconds timeout) {
  return impl_->gatherFromRound(topic, timeout);
}
void ElasticRendezvous::interrupt() { impl_->interrupt(); }

}  // namespace dlrun::rendezvous
