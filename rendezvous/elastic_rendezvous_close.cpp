// ElasticRendezvous's rounds as they close and as they are forgotten (elastic_rendezvous_impl.h):
// the one closer's claim, plan and writes, a node that came too late for one (a spare), and the
// tidying of the rounds two behind.
#include <algorithm>

#include "common/log.h"
#include "rendezvous/elastic_rendezvous_impl.h"
#include "store/leasing_store.h"

namespace dlrun::rendezvous::detail {

std::optional<std::vector<std::string>> ElasticImpl::closeRound(int round, int index) {
  // One closer per round: its assignments are the only ones, so members read theirs without
  // knowing the round's size first. If it dies half-way, its lease aborts the round.
  const std::string me = std::to_string(index);
  const auto nodeKeys = [&](int members) {
    std::vector<std::string> nodes;
    for (int i = 1; i <= members; ++i) nodes.push_back(keys_.node(round, i));
    return nodes;
  };
  // At the maximum the round holds the first maxNodes to join: no need to count them, and the
  // claim reads their records. The closer mostly came last: the records are there, and that
  // one read finds them. A member that dies after its record lands aborts the round through its
  // lease; one that died before it leased anything is waited for only a lease's lifetime.
  const bool atMaximum = index >= options_.maxNodes;
  // With the job's stop: a stop whose stopper read an older round as the newest (stopJob) is
  // seen here, so no round starts after it.
  std::vector<std::string> peeked =
      atMaximum ? nodeKeys(options_.maxNodes) : std::vector{keys_.joined(round)};
  peeked.push_back(keys_.failures());
  peeked.push_back(keys_.current());
  peeked.push_back(keys_.stop());
  auto claim = lease_->createThenPeek(keys_.closer(round), me, peeked);
  if (claim[0] != me) return std::nullopt;
  if (!claim.back().empty()) {
    lease_->compareSet(keys_.closed(round), "", std::string(elastic::kStopped));
    return std::nullopt;
  }
  claim.pop_back();
  // A newer round exists only once this one ended or was aborted: this node slept through it
  // (its keys may be forgotten already) and must not start it alone.
  if (!claim.back().empty() && toCount(claim.back(), keys_.current()) > round) {
    lease_->compareSet(keys_.closed(round), "", std::string(elastic::kAborted));
    return std::nullopt;
  }
  claim.pop_back();
  const int usedFailures = claim.back().empty() ? 0 : toCount(claim.back(), keys_.failures());
  claim.pop_back();
  const int members = atMaximum
                          ? options_.maxNodes
                          : std::min(toCount(claim[1], keys_.joined(round)), options_.maxNodes);
  const std::vector<std::string> nodes = nodeKeys(members);
  std::vector<std::string> texts =
      atMaximum ? std::vector(claim.begin() + 1, claim.end()) : lease_->peek(nodes);
  if (std::any_of(texts.begin(), texts.end(), [](const auto& t) { return t.empty(); })) {
    const auto giveUp = now() + options_.leaseTtl;
    while (!lease_->waitFor(nodes, options_.heartbeat)) {
      if (lease_->check({keys_.closed(round)})) return std::nullopt;
      if (now() >= giveUp) {
        lease_->compareSet(keys_.closed(round), "", std::string(elastic::kAborted));
        return std::nullopt;
      }
    }
    texts = lease_->peek(nodes);
  }
  std::vector<elastic::NodeRecord> records;
  for (const std::string& text : texts) {
    if (text.empty()) return std::nullopt;  // a record vanished with its lease: round aborted
    records.push_back(elastic::decodeNodeRecord(text));
  }
  elastic::Plan plan = elastic::planRound(records);
  for (auto& assignment : plan.byArrival)
    assignment.failures = std::max(assignment.failures, usedFailures);
  std::vector<std::string> keys, values, ids;
  for (int i = 1; i <= members; ++i) {
    keys.push_back(keys_.assignment(round, records[i - 1].id));
    values.push_back(elastic::encode(plan.byArrival[i - 1]));
    ids.push_back(records[i - 1].id);
  }
  keys.push_back(keys_.roster(round));
  values.push_back(elastic::encodeRoster(plan.roster));
  std::vector<std::string> names;
  for (const auto& record : records) names.push_back(elastic::nodeName(record));
  keys.push_back(keys_.names(round));
  values.push_back(elastic::encodeRoster({.endpoints = names}));
  keys.push_back(keys_.members(round));
  values.push_back(elastic::encodeMembers(ids));
  // Two writes, the close last: members read their assignments once they see the round closed.
  // (One etcd transaction for both would cost half the members a read: etcd sends each watched
  // key's events separately, in no set order, so the close could come before the assignment.)
  lease_->multiSet(keys, values);
  const std::string closed = std::to_string(members);
  if (lease_->compareSet(keys_.closed(round), "", closed) != closed) return std::nullopt;
  closedRound_ = round;
  std::vector<std::string> mine{closed, values[index - 1]};
  if (options_.fetchRoster) mine.push_back(values[members]);
  return mine;
}

void ElasticImpl::forgetRounds(int upTo) {
  const std::string done = lease_->peek({keys_.forgotten()})[0];
  const int from = done.empty() ? 0 : toCount(done, keys_.forgotten()) + 1;
  // Two rounds at most: rounds that ended before any closer waited in them (failing as they
  // formed, a store losing replies) leave a backlog, and a closer deleting it all key by key
  // would see its own round's end that much later. Two a round drain it.
  const int last = std::min(upTo, from + 1);
  if (from > last) return;
  // The mark first: a report arriving late for a round being forgotten (reportFailure) then
  // finds it, and writes nothing for the job. A tidier that dies half-way leaves some keys.
  lease_->set(keys_.forgotten(), std::to_string(last));
  for (int round = from; round <= last; ++round) {
    const auto found = lease_->peek({keys_.joined(round), keys_.members(round)});
    lease_->deleteKeys(keys_.ofRound(
        round,
        found[0].empty() ? 0 : std::min(toCount(found[0], keys_.joined(round)), options_.maxNodes),
        elastic::decodeMembers(found[1])));
  }
}

bool ElasticImpl::forgotten(int round) {
  const std::string done = lease_->peek({keys_.forgotten()})[0];
  return !done.empty() && toCount(done, keys_.forgotten()) >= round;
}

ElasticImpl::Step ElasticImpl::afterLateArrival(int round, int members) {
  dropKept();  // no round keeps them while this node waits
  if (members < options_.maxNodes) {
    RoundEnd joined{.kind = RoundEnd::Kind::NodeJoined, .node = elastic::nodeName(options_.self)};
    lease_->compareSet(keys_.end(round), "", elastic::encode(joined));
  } else {
    log::info("the job runs on its maximum number of nodes (" + std::to_string(members) +
              "); waiting as a spare");
    lease_->add(keys_.spares(round), 1);
    if (spareWaiting_) spareWaiting_();
  }
  // A spare waits as long as the job runs: it takes the place of a node that fails.
  while (!waitChunk(keys_.end(round))) {
    if (forgotten(round)) return NextRound{};
  }
  const std::optional<RoundEnd> end = readEnd(round);
  if (!end) return NextRound{};
  ended_ = Ended{round, members, spares(round), end->kind};
  if (end->endsJob()) return *end;
  return NextRound{};
}

int ElasticImpl::spares(int round) { return static_cast<int>(lease_->add(keys_.spares(round), 0)); }

}  // namespace dlrun::rendezvous::detail
