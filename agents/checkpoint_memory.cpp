#include "agents/checkpoint_memory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <system_error>
#include <vector>

#include "common/error.h"
#include "common/text.h"

namespace dlrun::agents {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kPrefix = "dlrun-checkpoints.";
constexpr std::string_view kLockFile = "lock";

// Whether `dir`'s lock is free (its agent gone): taken and let go at once.
bool unheld(const fs::path& dir) {
  const int fd = ::open((dir / kLockFile).c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return errno == ENOENT;  // made whole under another name, so never lockless
  const bool free = ::flock(fd, LOCK_EX | LOCK_NB) == 0;
  ::close(fd);
  return free;
}

// This user's directories in `base` that nobody holds.
void removeOrphans(const fs::path& base) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(base, ec)) {
    const auto owner = parseMemoryDirName(entry.path().filename().string());
    struct stat st {};
    if (!owner || owner->uid != ::getuid() || ::lstat(entry.path().c_str(), &st) != 0 ||
        !S_ISDIR(st.st_mode) || st.st_uid != ::getuid() || !unheld(entry.path()))
      continue;
    std::error_code ignored;
    fs::remove_all(entry.path(), ignored);
  }
}

}  // namespace

std::string memoryDirName(const MemoryOwner& owner, std::string_view unique) {
  return std::string(kPrefix) + std::to_string(owner.uid) + "." + std::to_string(owner.pid) + "." +
         std::string(unique);
}

std::optional<MemoryOwner> parseMemoryDirName(std::string_view name) {
  if (!name.starts_with(kPrefix)) return std::nullopt;
  name.remove_prefix(kPrefix.size());
  const std::vector<std::string> fields = split(name, '.');
  if (fields.size() != 3 || fields[2].empty()) return std::nullopt;
  for (char c : fields[2])
    if (!std::isalnum(static_cast<unsigned char>(c))) return std::nullopt;
  const auto uid = parseInteger<uid_t>(fields[0]);
  const auto pid = parseInteger<pid_t>(fields[1]);
  if (!uid || !pid || *pid <= 0) return std::nullopt;
  return MemoryOwner{*uid, *pid};
}

CheckpointMemory::CheckpointMemory(const fs::path& base) {
  removeOrphans(base);
  // Made and locked under a name of its own, then renamed: no other agent ever sees it unlocked.
  std::string making = (base / ".dlrun-checkpoints-new.XXXXXX").string();
  if (::mkdtemp(making.data()) == nullptr)  // 0700
    throw Error("cannot make the in-memory checkpoints' directory in " + base.string() + ": " +
                std::strerror(errno));
  lock_ = ::open((fs::path(making) / kLockFile).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  const std::string unique = making.substr(making.size() - 6);
  dir_ = base / memoryDirName({::getuid(), ::getpid()}, unique);
  if (lock_ < 0 || ::flock(lock_, LOCK_EX) != 0 || ::rename(making.c_str(), dir_.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    if (lock_ >= 0) ::close(lock_);
    std::error_code ignored;
    fs::remove_all(making, ignored);
    throw Error("cannot make the in-memory checkpoints' directory " + dir_.string() + ": " + why);
  }
}

CheckpointMemory::~CheckpointMemory() {
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
  ::close(lock_);
}

}  // namespace dlrun::agents
