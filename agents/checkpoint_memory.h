// The node's shared memory for in-memory checkpoints (dlrun.checkpoint,
// python/dlrun/checkpoint.py; docs/guides/checkpoints.md): one directory under /dev/shm an agent,
// given to its workers as DLRUN_CHECKPOINT_SHM, kept through the job's restarts and removed when
// the agent ends. The agent holds a lock in it while it runs; a directory whose lock nobody holds
// (its agent SIGKILLed: nothing ran to remove it) is removed by the next agent that starts on the
// node. A lock, not the PID in the name: agents in containers that share /dev/shm see neither
// each other's processes nor distinct PIDs.
#pragma once

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace dlrun::agents {

inline constexpr std::string_view kCheckpointMemoryVariable = "DLRUN_CHECKPOINT_SHM";
// --checkpoint-dir, and --checkpoint-write-every in seconds (set only with the directory)
inline constexpr std::string_view kCheckpointDirVariable = "DLRUN_CHECKPOINT_DIR";
inline constexpr std::string_view kCheckpointWriteEveryVariable = "DLRUN_CHECKPOINT_WRITE_EVERY";
// The module that copies and sums a save in one pass (checkpoint_copy.h), set where it is found
inline constexpr std::string_view kCheckpointCopyVariable = "DLRUN_CHECKPOINT_COPY";
inline constexpr std::string_view kCheckpointCopyModule = "dlrun-checkpoint-copy.so";

// Whose a directory is, as its name says (pure, below): the user and, for people, the agent's PID.
struct MemoryOwner {
  uid_t uid = 0;
  pid_t pid = 0;
  bool operator==(const MemoryOwner&) const = default;
};

// "dlrun-checkpoints.UID.PID.UNIQUE" (pure); UNIQUE: letters and digits.
std::string memoryDirName(const MemoryOwner& owner, std::string_view unique);
// The owner a directory name says, nothing for a name of another kind (pure).
std::optional<MemoryOwner> parseMemoryDirName(std::string_view name);

class CheckpointMemory {
 public:
  // Makes this agent's directory in `base` and locks it, first removing this user's directories
  // there that nobody holds. Throws Error when it cannot be made.
  explicit CheckpointMemory(const std::filesystem::path& base = "/dev/shm");
  ~CheckpointMemory();  // removes the directory and everything in it
  CheckpointMemory(const CheckpointMemory&) = delete;
  CheckpointMemory& operator=(const CheckpointMemory&) = delete;

  const std::filesystem::path& dir() const { return dir_; }

 private:
  std::filesystem::path dir_;
  int lock_ = -1;  // the lock file, flock()ed while the agent runs; not inherited by workers
};

}  // namespace dlrun::agents
