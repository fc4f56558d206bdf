#include "agents/checkpoint_files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "common/error.h"
#include "common/text.h"

namespace dlrun::agents {

namespace fs = std::filesystem;

std::optional<std::pair<int64_t, std::string>> numberAndWord(const std::string& line) {
  if (!line.ends_with('\n')) return std::nullopt;  // written whole, a line
  std::vector<std::string> fields = split(std::string_view(line).substr(0, line.size() - 1), ' ');
  if (fields.size() != 2 || fields[1].empty()) return std::nullopt;
  const auto number = parseInteger<int64_t>(fields[0]);
  if (!number || *number < 0) return std::nullopt;
  return std::pair{*number, std::move(fields[1])};
}

std::optional<int64_t> markedStep(const std::string& mark) {
  const auto line = numberAndWord(mark);
  return line ? std::optional(line->first) : std::nullopt;
}

std::optional<std::string> readText(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

std::optional<int64_t> readMark(const fs::path& file) {
  const auto text = readText(file);
  return text ? markedStep(*text) : std::nullopt;
}

void doneWith(const fs::path& request, const std::string& asked) {
  if (readText(request) != asked) return;
  std::error_code ec;
  fs::remove(request, ec);
}

std::optional<int> numbered(const fs::path& path, std::string_view prefix) {
  const std::string name = path.filename().string();
  if (!name.starts_with(prefix)) return std::nullopt;
  return parseInteger<int>(std::string_view(name).substr(prefix.size()));
}

std::vector<std::pair<int, fs::path>> ranksIn(const fs::path& memory) {
  std::vector<std::pair<int, fs::path>> ranks;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(memory, ec))
    if (const auto rank = numbered(entry.path(), "rank-")) ranks.emplace_back(*rank, entry.path());
  return ranks;
}

std::vector<fs::path> slotsOf(const fs::path& memoryRank) {
  std::vector<fs::path> slots;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(memoryRank, ec))
    if (numbered(entry.path(), "slot-")) slots.push_back(entry.path());
  return slots;
}

void forEachRequest(
    const fs::path& memory, const std::string& name,
    const std::function<void(int rank, const fs::path& slot, const std::string& request)>& handle) {
  for (const auto& [rank, memoryRank] : ranksIn(memory))
    for (const fs::path& slot : slotsOf(memoryRank)) {
      const auto request = readText(slot / name);
      if (!request) continue;
      handle(rank, slot, *request);
      doneWith(slot / name, *request);
    }
}

SlotReadLock::SlotReadLock(const fs::path& slot)
    : fd_(::open((slot / "lock").c_str(), O_RDONLY | O_CREAT | O_CLOEXEC, 0600)) {
  if (fd_ < 0 || ::flock(fd_, LOCK_SH) != 0) {
    const std::string why = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    throw Error("cannot lock " + (slot / "lock").string() + ": " + why);
  }
}

SlotReadLock::~SlotReadLock() { ::close(fd_); }

}  // namespace dlrun::agents
