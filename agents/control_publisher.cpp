#include "agents/control_publisher.h"

#include "common/error.h"
#include "common/log.h"

namespace dlrun::agents {

namespace control = rendezvous::control;

ControlPublisher::ControlPublisher(ControlOptions options,
                                   std::function<void(const ControlCommand&)> onCommand)
    : options_(std::move(options)), keys_(options_.runId), onCommand_(std::move(onCommand)) {
  writer_ = std::thread([this] { write(); });
  listener_ = std::thread([this] { listen(); });
}

ControlPublisher::~ControlPublisher() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    if (listening_) listening_->abort();
  }
  changed_.notify_all();
  writer_.join();
  listener_.join();
}

void ControlPublisher::node(control::NodeState state) {
  {
    std::lock_guard lock(mutex_);
    node_ = std::move(state);
    ++nodeChanges_;
  }
  changed_.notify_all();
}

void ControlPublisher::event(control::JobEvent event) {
  {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(event));
  }
  changed_.notify_all();
}

void ControlPublisher::write() {
  std::unique_ptr<rendezvous::LeasingStore> store;
  bool warned = false;
  while (true) {
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || node_ || !events_.empty(); });
      if (!node_ && events_.empty()) return;  // stopping, nothing left
    }
    try {
      if (!store) store = options_.connect();
      writeOnce(*store);
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

// Registration once; then the queued events, numbered by the store, and the newest node state.
void ControlPublisher::writeOnce(rendezvous::LeasingStore& store) {
  if (!registered_) {
    const std::string meta = control::encode(options_.meta);
    // Read first: all but the first node find it (on etcd a swap costs a log entry, even one
    // that fails).
    if (store.peek({keys_.meta()})[0].empty() && store.compareSet(keys_.meta(), "", meta) == meta)
      store.append(control::Keys::jobs(), options_.runId + "\n");
    store.append(keys_.nodes(), options_.nodeName + "\n");
    registered_ = true;
  }
  // What is queued goes in one batch: one add numbers its events, one multiSet writes them
  // with the node state (on etcd each write is a log entry; a change often brings several
  // events at once, and the node's state with them).
  std::vector<control::JobEvent> events;
  std::optional<control::NodeState> state;
  uint64_t changes;
  {
    std::lock_guard lock(mutex_);
    events.assign(events_.begin(), events_.end());
    state = node_;
    changes = nodeChanges_;
  }
  if (events.empty() && !state) return;
  std::vector<std::string> keys, values;
  if (!events.empty()) {
    const int64_t last = store.add(keys_.seq(), static_cast<int64_t>(events.size()));
    for (size_t i = 0; i < events.size(); ++i) {
      events[i].seq = last - static_cast<int64_t>(events.size() - 1 - i);
      keys.push_back(keys_.event(events[i].seq));
      values.push_back(control::encode(events[i]));
    }
  }
  if (state) {
    keys.push_back(keys_.node(options_.nodeName));
    values.push_back(control::encode(*state));
  }
  store.multiSet(keys, values);
  std::lock_guard lock(mutex_);
  events_.erase(events_.begin(), events_.begin() + static_cast<std::ptrdiff_t>(events.size()));
  if (nodeChanges_ == changes) node_.reset();  // else a newer one came: it goes next time
}

void ControlPublisher::listen() {
  std::unique_ptr<rendezvous::LeasingStore> store;  // outlives listening_'s use of it
  try {
    store = options_.connect();
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      listening_ = store.get();
    }
    // Commands sent before this agent started are not for it.
    for (int64_t next = store->add(keys_.signals(), 0) + 1;; ++next) {
      while (!store->waitFor({keys_.signal(next)}, std::chrono::hours(1))) {
      }
      const std::string text = store->peek({keys_.signal(next)})[0];
      if (auto command = control::decodeCommand(text)) {
        onCommand_(*command);
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

}  // namespace dlrun::agents
