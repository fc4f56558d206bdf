#include "agents/checkpoint_flush.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <system_error>

#include "common/error.h"
#include "common/text.h"

namespace dlrun::agents {

namespace fs = std::filesystem;

namespace {

constexpr int kStepsKept = 2;
const char* const kFiles[] = {"tensors", "meta", "step"};  // `step` last: the copy's mark

std::optional<int64_t> readMark(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return std::nullopt;
  return markedStep(std::string(std::istreambuf_iterator<char>(in), {}));
}

std::optional<int> numbered(const fs::path& path, std::string_view prefix) {
  const std::string name = path.filename().string();
  if (!name.starts_with(prefix)) return std::nullopt;
  return parseInteger<int>(std::string_view(name).substr(prefix.size()));
}

void sync(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    throw Error("cannot sync " + path.string() + ": " + why);
  }
  ::close(fd);
}

// One copy to dir/step-S, whole or not at all.
void writeCopy(const fs::path& slot, const fs::path& rankDir, int64_t step) {
  const fs::path made = rankDir / (".step-" + std::to_string(step) + ".new");
  fs::remove_all(made);
  fs::create_directories(made);
  for (const char* name : kFiles) {
    fs::copy_file(slot / name, made / name);
    sync(made / name);
  }
  // The copy changed under the read (a worker still saving): not this step's, left out.
  if (readMark(slot / "step") != step || readMark(made / "step") != step) {
    fs::remove_all(made);
    throw Error("its copy of step " + std::to_string(step) + " changed as it was written");
  }
  sync(made);
  fs::rename(made, rankDir / ("step-" + std::to_string(step)));
  sync(rankDir);
}

// The whole steps of a rank in `dir`, oldest first.
std::map<int64_t, fs::path> stepsOnDisk(const fs::path& rankDir) {
  std::map<int64_t, fs::path> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(rankDir, ec))
    if (const auto step = numbered(entry.path(), "step-");
        step && readMark(entry.path() / "step") == *step)
      found[*step] = entry.path();
  return found;
}

void flushRank(const fs::path& memoryRank, const fs::path& rankDir, int rank, FlushReport& report) {
  std::map<int64_t, fs::path> copies;  // the marked slots
  std::error_code ec;
  for (const auto& slot : fs::directory_iterator(memoryRank, ec))
    if (const auto step = readMark(slot.path() / "step")) copies[*step] = slot.path();
  if (copies.empty()) return;
  fs::create_directories(rankDir);
  for (const auto& entry : fs::directory_iterator(rankDir, ec))  // an end cut short
    if (entry.path().filename().string().starts_with(".step-")) fs::remove_all(entry.path(), ec);
  auto onDisk = stepsOnDisk(rankDir);
  for (const auto& [step, slot] : copies) {
    if (onDisk.contains(step)) continue;
    try {
      writeCopy(slot, rankDir, step);
      report.written.emplace_back(rank, step);
    } catch (const std::exception& e) {
      report.problems.push_back("rank " + std::to_string(rank) + ": " + e.what());
    }
  }
  onDisk = stepsOnDisk(rankDir);
  while (onDisk.size() > kStepsKept) {
    fs::remove_all(onDisk.begin()->second, ec);
    onDisk.erase(onDisk.begin());
  }
}

}  // namespace

std::optional<int64_t> markedStep(const std::string& mark) {
  if (!mark.ends_with('\n')) return std::nullopt;  // written whole, a line
  const std::vector<std::string> fields =
      split(std::string_view(mark).substr(0, mark.size() - 1), ' ');
  if (fields.size() != 2 || fields[1].empty()) return std::nullopt;
  const auto step = parseInteger<int64_t>(fields[0]);
  if (!step || *step < 0) return std::nullopt;
  return step;
}

FlushReport flushCheckpoints(const fs::path& memory, const fs::path& dir) {
  FlushReport report;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(memory, ec)) {
    const auto rank = numbered(entry.path(), "rank-");
    if (!rank) continue;
    const fs::path rankDir = dir / ("rank-" + std::to_string(*rank));
    try {
      flushRank(entry.path(), rankDir, *rank, report);
    } catch (const std::exception& e) {  // the directory itself: full, read-only, missing
      report.problems.push_back("rank " + std::to_string(*rank) + ": " + e.what());
    }
  }
  return report;
}

}  // namespace dlrun::agents
