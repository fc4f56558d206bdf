#include "agents/checkpoint_courier.h"

#include "agents/checkpoint_flush.h"
#include "agents/checkpoint_peer.h"

namespace dlrun::agents {

namespace fs = std::filesystem;

CheckpointCourier::CheckpointCourier(fs::path memory, std::optional<fs::path> dir,
                                     std::chrono::milliseconds every, Told told)
    : thread_(
          [this, memory = std::move(memory), dir = std::move(dir), every, told = std::move(told)] {
            auto tell = [&](const char* how, const CopyReport& report) {
              if (!report.copied.empty() || !report.problems.empty()) told(how, report);
            };
            std::unique_lock lock(mutex_);
            while (!wake_.wait_for(lock, every, [this] { return stopping_; })) {
              lock.unlock();
              if (dir) tell("written", writeRequested(memory, *dir));
              tell("sent", sendRequested(memory));
              lock.lock();
            }
          }) {}

CheckpointCourier::~CheckpointCourier() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

}  // namespace dlrun::agents
