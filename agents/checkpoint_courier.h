// The thread that carries the copies a node's workers ask to be carried (their request files
// beside each copy, checkpoint_files.h): to --checkpoint-dir (`write`, checkpoint_flush.h) and to
// a peer node's agent (`replicate`, checkpoint_peer.h), looked at every `every`. A thread of its
// own: disk writes and sends block.
#pragma once

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "agents/checkpoint_files.h"

namespace dlrun::agents {

class CheckpointCourier {
 public:
  // `told` hears of each pass that did something: "written" (to `dir`) or "sent" (to a peer).
  using Told = std::function<void(const std::string& how, const CopyReport& report)>;
  CheckpointCourier(std::filesystem::path memory, std::optional<std::filesystem::path> dir,
                    std::chrono::milliseconds every, Told told);
  ~CheckpointCourier();  // stops at the end of a copy under way, and joins
  CheckpointCourier(const CheckpointCourier&) = delete;
  CheckpointCourier& operator=(const CheckpointCourier&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace dlrun::agents
