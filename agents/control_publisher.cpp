#include "agents/control_publisher.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "rendezvous/elastic_protocol.h"

namespace dlrun::agents {

namespace {

// The publisher is an observer: where CPUs are short (many agents on one host, a node busy
// starting its workers), the job's own threads go first. A niced thread that wakes still runs
// within milliseconds, so commands are not held up.
void yieldToTheJob() { ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10); }

constexpr auto kWatchEvery = std::chrono::seconds(2);  // the leader's look for stragglers
constexpr double kStaleProgress = 30;  // seconds: a record older is an agent gone (or stopped)

std::string clearedDetail(const control::Straggler& s) {
  const std::string rank = "rank " + std::to_string(s.rank) + " on " + s.node;
  if (s.stepsPerSecond < 0) return rank + " no longer runs";
  char pace[96];
  std::snprintf(pace, sizeof pace, " keeps pace again: %.2f steps/s, the median %.2f",
                s.stepsPerSecond, s.median);
  return rank + pace;
}

}  // namespace

namespace detail {

// The publisher's inside: what node(), event() and progress() queue, and the two threads that
// take it to the store and bring commands back.
class PublisherImpl {
 public:
  using StragglersSeen = ControlPublisher::StragglersSeen;

  PublisherImpl(ControlOptions options, std::function<void(const ControlCommand&)> onCommand,
                StragglersSeen onStragglers);
  ~PublisherImpl();  // writes what is queued (within a few seconds), then stops both threads

  void node(control::NodeState state);
  void event(control::JobEvent event);
  void progress(control::NodeProgress progress);
  void round(int round, int nodes, bool leader);
  void flush(std::chrono::milliseconds limit);
  void attemptFiles(AttemptFiles files) { logs_.attempt(std::move(files)); }

 private:
  void write();
  void listen(int64_t next, int64_t agent);
  void writeOnce(LeasingStore& store);
  // Registers this agent (its index in ctl/nodes, its id) and reads the first command's number.
  void registerNode(LeasingStore& store);
  // Whether the writer has something to do at `now` (mutex_ held); else when it will.
  bool due(Clock::time_point now, Clock::time_point& next) const;
  void watchStragglers(LeasingStore& store);

  const ControlOptions options_;
  const control::Keys keys_;
  std::function<void(const ControlCommand&)> onCommand_;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::condition_variable written_;  // events_ lost its oldest entries to the store
  std::optional<control::NodeState> node_;
  int firstRound_ = -1;  // the round of the first node() in a round, sent with each (firstRound)
  uint64_t nodeChanges_ = 0;  // node() calls: tells writeOnce whether node_ is the one it wrote
  std::deque<control::JobEvent> events_;
  std::optional<control::NodeProgress> progress_;
  Clock::time_point progressAt_{};  // when progress may be written next
  Clock::duration progressEvery_ = std::chrono::seconds(1);
  int round_ = -1;
  bool leader_ = false;
  Clock::time_point watchAt_{};  // when the leader looks for stragglers next
  bool stopping_ = false;
  // The writer's alone: this node's place in ctl/nodes, and the first command for it; whether
  // its name (and as the job's first node, the job's settings) went out with a state.
  std::optional<int64_t> index_;
  std::optional<int64_t> firstCommand_;
  bool named_ = false;
  LeasingStore* listening_ = nullptr;  // the listener's store, to abort it
  // The straggler watch's, on the writer's thread: the rule over this round's ranks, the agents'
  // host names, whether this round's list went out.
  StragglersSeen onStragglers_;
  control::StragglerTracker stragglers_;
  int watchedRound_ = -1;
  std::map<int64_t, std::string> names_;

  LogServer logs_;  // `dlrun logs` requests, from the listener (joined before it goes)
  std::thread writer_;
  std::thread listener_;  // started by writer_ (joined after it)
};

PublisherImpl::PublisherImpl(ControlOptions options,
                             std::function<void(const ControlCommand&)> onCommand,
                             StragglersSeen onStragglers)
    : options_(std::move(options)),
      keys_(options_.runId),
      onCommand_(std::move(onCommand)),
      onStragglers_(std::move(onStragglers)),
      stragglers_(options_.stragglers),
      logs_(options_.runId, options_.nodeName, options_.connect) {
  writer_ = std::thread([this] { write(); });
}

PublisherImpl::~PublisherImpl() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    if (listening_) listening_->abort();
  }
  changed_.notify_all();
  writer_.join();
  if (listener_.joinable()) listener_.join();
}

void PublisherImpl::node(control::NodeState state) {
  {
    std::lock_guard lock(mutex_);
    // A node sitting out before its first round is in none (group rank -1): it joins later.
    if (firstRound_ < 0 && state.groupRank >= 0) firstRound_ = state.round;
    state.firstRound = firstRound_;
    node_ = std::move(state);
    ++nodeChanges_;
  }
  changed_.notify_all();
}

void PublisherImpl::event(control::JobEvent event) {
  {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(event));
  }
  changed_.notify_all();
}

void PublisherImpl::progress(control::NodeProgress progress) {
  {
    std::lock_guard lock(mutex_);
    progress_ = std::move(progress);
  }
  changed_.notify_all();
}

void PublisherImpl::round(int round, int nodes, bool leader) {
  {
    std::lock_guard lock(mutex_);
    round_ = round;
    progressEvery_ = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(control::recordPeriod(nodes)));
    leader_ = leader && options_.stragglers.fraction > 0;
    watchAt_ = Clock::now() + kWatchEvery;
  }
  changed_.notify_all();
}

bool PublisherImpl::due(Clock::time_point now, Clock::time_point& next) const {
  if (stopping_ || node_ || !events_.empty()) return true;
  next = Clock::time_point::max();
  if (progress_) {
    if (now >= progressAt_) return true;
    next = progressAt_;
  }
  if (leader_) {
    if (now >= watchAt_) return true;
    next = std::min(next, watchAt_);
  }
  return false;
}

void PublisherImpl::flush(std::chrono::milliseconds limit) {
  std::unique_lock lock(mutex_);
  written_.wait_for(lock, limit, [&] { return events_.empty(); });
}

void PublisherImpl::write() {
  yieldToTheJob();
  std::unique_ptr<LeasingStore> store;
  bool warned = false;
  while (true) {
    bool watch = false;
    {
      std::unique_lock lock(mutex_);
      for (Clock::time_point next; !due(Clock::now(), next);) {
        if (next == Clock::time_point::max()) {
          changed_.wait(lock);
        } else {
          changed_.wait_until(lock, next);
        }
      }
      if (stopping_ && !node_ && events_.empty()) return;  // nothing left
      if (leader_ && Clock::now() >= watchAt_ && !stopping_) {
        watch = true;
        watchAt_ = Clock::now() + std::max<Clock::duration>(kWatchEvery, progressEvery_);
      }
    }
    try {
      if (!store) store = options_.connect();
      writeOnce(*store);
      if (watch) watchStragglers(*store);
      std::lock_guard lock(mutex_);
      if (!stopping_ && !listener_.joinable())
        listener_ =
            std::thread([this, next = *firstCommand_, agent = *index_] { listen(next, agent); });
    } catch (const std::exception& e) {
      store.reset();
      // The rendezvous says it when the store is gone; this is only the observer.
      if (!warned) log::debug(std::string("cannot publish to the control plane: ") + e.what());
      warned = true;
      std::lock_guard lock(mutex_);
      if (stopping_) return;  // the store is gone with the job: drop what is left
    }
  }
}

void PublisherImpl::registerNode(LeasingStore& store) {
  if (!index_) index_ = store.add(keys_.nodes(), 1);
  if (firstCommand_) return;
  const rendezvous::elastic::Keys job(options_.runId);
  const auto found = store.peek({keys_.signals(), job.stop()});
  firstCommand_ = storedCount(found[0], keys_.signals()) + 1;
  // A multi-node job's agents follow the stop key through their rendezvous already.
  if (options_.meta.backend == control::kLocalBackend && !found[1].empty())
    onCommand_({.kind = ControlCommand::Kind::Stop,
                .value = rendezvous::elastic::decodeRoundEnd(found[1]).exitCode});
}

// Registration once; then the queued events, numbered by the store, and the newest node state
// under this agent's index (with its host's name, and from the job's first agent the job's
// settings, the first time).
void PublisherImpl::writeOnce(LeasingStore& store) {
  registerNode(store);
  // What is queued goes in one batch: one add numbers its events, one multiSet writes them
  // with the node state (on etcd each write is a log entry; a change often brings several
  // events at once, and the node's state with them).
  std::vector<control::JobEvent> events;
  std::optional<control::NodeState> state;
  std::optional<control::NodeProgress> progress;
  uint64_t changes;
  {
    std::lock_guard lock(mutex_);
    events.assign(events_.begin(), events_.end());
    state = node_;
    changes = nodeChanges_;
    if (progress_ && Clock::now() >= progressAt_ && !stopping_) {
      progress = std::move(progress_);
      progress_.reset();
      progressAt_ = Clock::now() + progressEvery_;
    }
  }
  if (events.empty() && !state && !progress && named_) return;
  std::vector<std::string> keys, values;
  if (!events.empty()) {
    const int64_t last = store.add(keys_.seq(), static_cast<int64_t>(events.size()));
    for (size_t i = 0; i < events.size(); ++i) {
      events[i].seq = last - static_cast<int64_t>(events.size() - 1 - i);
      events[i].agent = static_cast<int>(*index_);
      keys.push_back(keys_.event(events[i].seq));
      values.push_back(control::encode(events[i]));
    }
  }
  if (state) {
    keys.push_back(keys_.node(*index_));
    values.push_back(control::encode(*state));
  }
  if (progress) {
    keys.push_back(keys_.progress(*index_));
    values.push_back(control::encode(*progress));
  }
  const bool first = *index_ == 1;
  if (!named_) {
    keys.push_back(keys_.nodeAt(*index_));
    values.push_back(options_.nodeName);
    if (first) {
      keys.push_back(keys_.meta());
      values.push_back(control::encode(options_.meta));
    }
  }
  store.multiSet(keys, values);
  if (!named_ && first) store.append(control::Keys::jobs(), options_.runId + "\n");
  named_ = true;
  std::lock_guard lock(mutex_);
  events_.erase(events_.begin(), events_.begin() + static_cast<std::ptrdiff_t>(events.size()));
  if (nodeChanges_ == changes) node_.reset();  // else a newer one came: it goes next time
  written_.notify_all();
}

// Group rank 0's look at every agent's pace: one request for the count and the records (and
// the names of agents not seen before), the rule, then what changed goes out as events.
void PublisherImpl::watchStragglers(LeasingStore& store) {
  int round;
  {
    std::lock_guard lock(mutex_);
    round = round_;
  }
  const int64_t agents = storedCount(store.peek({keys_.nodes()})[0], keys_.nodes());
  std::vector<std::string> keys;
  for (int64_t i = 1; i <= agents; ++i) keys.push_back(keys_.progress(i));
  for (int64_t i = 1; i <= agents; ++i)
    if (!names_.contains(i)) keys.push_back(keys_.nodeAt(i));
  const auto values = store.peek(keys);
  size_t named = static_cast<size_t>(agents);
  for (int64_t i = 1; i <= agents; ++i)
    if (!names_.contains(i) && !values[named++].empty()) names_[i] = values[named - 1];
  const double now = unixSeconds();
  std::vector<control::RankRate> ranks;
  for (int64_t i = 1; i <= agents; ++i) {
    const std::string& text = values[static_cast<size_t>(i - 1)];
    if (text.empty()) continue;
    try {
      const control::NodeProgress p = control::decodeNodeProgress(text);
      if (p.round != round || now - p.time > std::max(kStaleProgress, 3 * p.period)) continue;
      for (const auto& r : p.ranks)
        if (!r.exited)
          ranks.push_back({.rank = r.rank, .node = names_[i], .stepsPerSecond = r.stepsPerSecond});
    } catch (const ProtocolError&) {
      continue;  // a record this version cannot read says nothing of anyone's pace
    }
  }
  const bool fresh = watchedRound_ != round;
  if (fresh) stragglers_.reset();
  watchedRound_ = round;
  const control::StragglerChanges changes = stragglers_.observe(ranks, now);
  if (!fresh && changes.named.empty() && changes.cleared.empty()) return;
  store.set(keys_.stragglers(), control::encodeStragglers(stragglers_.named()));
  {
    std::lock_guard lock(mutex_);
    for (const auto& s : changes.named) {
      log::warn("straggler: " + control::describe(s, now));
      // The event is this node's (it judged); the detail names the slow rank's node.
      events_.push_back({.time = now,
                         .kind = "straggler",
                         .node = options_.nodeName,
                         .round = round,
                         .rank = s.rank,
                         .detail = control::describe(s, now)});
    }
    for (const auto& s : changes.cleared)
      events_.push_back({.time = now,
                         .kind = "straggler_cleared",
                         .node = options_.nodeName,
                         .round = round,
                         .rank = s.rank,
                         .detail = clearedDetail(s)});
  }
  if (onStragglers_) onStragglers_(stragglers_.named());
}

void PublisherImpl::listen(int64_t next, int64_t agent) {
  yieldToTheJob();
  std::unique_ptr<LeasingStore> store;  // outlives listening_'s use of it
  try {
    store = options_.connect();
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      listening_ = store.get();
    }
    for (;; ++next) {
      while (!store->waitFor({keys_.signal(next)}, std::chrono::hours(1))) {
      }
      const std::string text = store->peek({keys_.signal(next)})[0];
      if (auto command = control::decodeCommand(text)) {
        if (command->kind == ControlCommand::Kind::Logs) {
          logs_.serve(command->value, agent);
        } else {
          onCommand_(*command);
        }
      } else {
        log::info("ignoring a malformed control command '" + text + "' in the store");
      }
    }
  } catch (const std::exception& e) {
    std::lock_guard lock(mutex_);
    listening_ = nullptr;
    if (!stopping_) log::debug(std::string("control commands stop: ") + e.what());
  }
}

}  // namespace detail

ControlPublisher::ControlPublisher(ControlOptions options,
                                   std::function<void(const ControlCommand&)> onCommand,
                                   StragglersSeen onStragglers)
    : impl_(std::make_unique<detail::PublisherImpl>(std::move(options), std::move(onCommand),
                                                    std::move(onStragglers))) {}

ControlPublisher::~ControlPublisher() = default;  // ~PublisherImpl flushes, then joins

void ControlPublisher::node(control::NodeState state) { impl_->node(std::move(state)); }
void ControlPublisher::event(control::JobEvent event) { impl_->event(std::move(event)); }
void ControlPublisher::progress(control::NodeProgress progress) {
  impl_->progress(std::move(progress));
}
void ControlPublisher::round(int round, int nodes, bool leader) {
  impl_->round(round, nodes, leader);
}
void ControlPublisher::flush(std::chrono::milliseconds limit) { impl_->flush(limit); }
void ControlPublisher::attemptFiles(AttemptFiles files) { impl_->attemptFiles(std::move(files)); }

}  // namespace dlrun::agents
