#include "agents/checkpoint_memory.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <system_error>
#include <vector>

#include "common/error.h"

namespace dlrun::agents {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kPrefix = "dlrun-checkpoints.";

std::optional<uint64_t> number(std::string_view text) {
  if (text.empty() || text.size() > 19) return std::nullopt;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    value = value * 10 + static_cast<uint64_t>(c - '0');
  }
  return value;
}

// This user's directories in `base` whose agent is gone.
void removeOrphans(const fs::path& base) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(base, ec)) {
    const auto owner = parseMemoryDirName(entry.path().filename().string());
    if (!owner || owner->uid != ::getuid()) continue;
    if (processStartTicks(owner->pid) == owner->startTicks) continue;  // its agent still runs
    std::error_code ignored;
    fs::remove_all(entry.path(), ignored);
  }
}

}  // namespace

std::string memoryDirName(const MemoryOwner& owner) {
  return std::string(kPrefix) + std::to_string(owner.uid) + "." + std::to_string(owner.pid) + "." +
         std::to_string(owner.startTicks);
}

std::optional<MemoryOwner> parseMemoryDirName(std::string_view name) {
  if (!name.starts_with(kPrefix)) return std::nullopt;
  name.remove_prefix(kPrefix.size());
  std::vector<std::string_view> fields;
  for (size_t dot; (dot = name.find('.')) != std::string_view::npos; name.remove_prefix(dot + 1))
    fields.push_back(name.substr(0, dot));
  fields.push_back(name);
  if (fields.size() != 3) return std::nullopt;
  const auto uid = number(fields[0]), pid = number(fields[1]), ticks = number(fields[2]);
  if (!uid || !pid || !ticks || *pid == 0) return std::nullopt;
  return MemoryOwner{static_cast<uid_t>(*uid), static_cast<pid_t>(*pid), *ticks};
}

std::optional<uint64_t> processStartTicks(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');  // the command's name may hold spaces and parentheses
  if (paren == std::string::npos) return std::nullopt;
  std::istringstream fields(stat.substr(paren + 2));
  std::string field;
  for (int i = 0; i < 20 && fields >> field; ++i) {
  }
  return number(field);  // the 22nd field, starttime (the 20th after the state)
}

CheckpointMemory::CheckpointMemory(const fs::path& base) {
  removeOrphans(base);
  const MemoryOwner self{::getuid(), ::getpid(), processStartTicks(::getpid()).value_or(0)};
  dir_ = base / memoryDirName(self);
  std::error_code ec;
  fs::remove_all(dir_, ec);  // a name this agent's own: nothing of another's
  if (!fs::create_directory(dir_, ec) || ec)
    throw Error("cannot make the in-memory checkpoints' directory " + dir_.string() + ": " +
                (ec ? ec.message() : std::string("it exists")));
  fs::permissions(dir_, fs::perms::owner_all, ec);
}

CheckpointMemory::~CheckpointMemory() {
  std::error_code ignored;
  fs::remove_all(dir_, ignored);
}

}  // namespace dlrun::agents
