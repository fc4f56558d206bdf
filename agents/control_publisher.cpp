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

// Events first, in order, each numbered by the store; then the newest node state.
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
  while (true) {
    control::JobEvent event;
    {
      std::lock_guard lock(mutex_);
      if (events_.empty()) break;
      event = events_.front();
    }
    event.seq = store.add(keys_.seq(), 1);
    store.set(keys_.event(event.seq), control::encode(event));
    std::lock_guard lock(mutex_);
    events_.pop_front();
  }
  std::optional<control::NodeState> state;
  {
    std::lock_guard lock(mutex_);
    state.swap(node_);
  }
  if (state) store.set(keys_.node(options_.nodeName), control::encode(*state));
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
