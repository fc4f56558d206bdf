// The node's shared memory for in-memory checkpoints (dlrun.checkpoint,
// python/dlrun/checkpoint.py; docs/guides/checkpoints.md): one directory under /dev/shm an agent,
// given to its workers as DLRUN_CHECKPOINT_SHM, kept through the job's restarts and removed when
// the agent ends. A directory whose agent is gone (SIGKILLed: nothing ran to remove it) is
// removed by the next agent that starts on the node.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace dlrun::agents {

inline constexpr std::string_view kCheckpointMemoryVariable = "DLRUN_CHECKPOINT_SHM";

// Who made a directory: its name says (pure, below).
struct MemoryOwner {
  uid_t uid = 0;
  pid_t pid = 0;
  uint64_t startTicks = 0;  // the agent's start in clock ticks (/proc/PID/stat): PIDs are reused
  bool operator==(const MemoryOwner&) const = default;
};

// "dlrun-checkpoints.UID.PID.TICKS" (pure).
std::string memoryDirName(const MemoryOwner& owner);
// The owner a directory name says, nothing for a name of another kind (pure).
std::optional<MemoryOwner> parseMemoryDirName(std::string_view name);

class CheckpointMemory {
 public:
  // Makes this agent's directory in `base`, first removing this user's directories there whose
  // agent no longer runs. Throws Error when it cannot be made.
  explicit CheckpointMemory(const std::filesystem::path& base = "/dev/shm");
  ~CheckpointMemory();  // removes the directory and everything in it
  CheckpointMemory(const CheckpointMemory&) = delete;
  CheckpointMemory& operator=(const CheckpointMemory&) = delete;

  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

// The start time of process `pid` in clock ticks, nothing when it does not run.
std::optional<uint64_t> processStartTicks(pid_t pid);

}  // namespace dlrun::agents
