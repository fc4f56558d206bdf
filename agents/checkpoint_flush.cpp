#include "agents/checkpoint_flush.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <system_error>

#include "agents/checkpoint_files.h"
#include "common/error.h"
#include "common/text.h"

namespace dlrun::agents {

namespace fs = std::filesystem;

namespace {

constexpr size_t kNewestKept = 3;

void sync(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const std::string why = std::strerror(errno);
    if (fd >= 0) ::close(fd);
    throw Error("cannot sync " + path.string() + ": " + why);
  }
  ::close(fd);
}

fs::path madeName(const fs::path& rankDir, int64_t step) {
  return rankDir / (".step-" + std::to_string(step) + ".new");
}

// The slot's files into the rank's directory, under a name of their own (page cache speed).
void copyIn(const fs::path& slot, const fs::path& rankDir, int64_t step) {
  const fs::path made = madeName(rankDir, step);
  fs::remove_all(made);
  fs::create_directories(made);
  for (const char* name : kCopyFiles) fs::copy_file(slot / name, made / name);
  // The copy changed under the read (a worker still saving): not this step's, left out.
  if (readMark(slot / "step") != step || readMark(made / "step") != step) {
    fs::remove_all(made);
    throw Error("its copy of step " + std::to_string(step) + " changed as it was written");
  }
}

// The copy made whole: synced, then renamed into place.
void commit(const fs::path& rankDir, int64_t step) {
  const fs::path made = madeName(rankDir, step);
  for (const char* name : kCopyFiles) sync(made / name);
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

fs::path rankDirOf(const fs::path& dir, int rank) { return dir / ("rank-" + std::to_string(rank)); }

// Every rank's whole steps in `dir`: ranks 0 to worldSize - 1 and `rank`.
std::map<int, std::set<int64_t>> wholeSteps(const fs::path& dir, int rank, int worldSize) {
  std::map<int, std::set<int64_t>> whole;
  for (int r = 0; r < std::max(worldSize, rank + 1); ++r)
    for (const auto& [step, path] : stepsOnDisk(rankDirOf(dir, r))) whole[r].insert(step);
  return whole;
}

// stepsToRemove's rule on `rank`'s directory.
void prune(const fs::path& dir, int rank, int worldSize) {
  std::error_code ec;
  for (int64_t step : stepsToRemove(wholeSteps(dir, rank, worldSize), rank, worldSize))
    fs::remove_all(rankDirOf(dir, rank) / ("step-" + std::to_string(step)), ec);
}

// Whether `step` of `rank` is worth writing: not there yet, nor older than a step every rank
// holds there (it would go at once).
bool wanted(const fs::path& dir, int rank, int worldSize, int64_t step) {
  const auto whole = wholeSteps(dir, rank, worldSize);
  const auto common = newestInCommon(whole, worldSize);
  const auto mine = whole.find(rank);
  return !(common && step < *common) && (mine == whole.end() || !mine->second.contains(step));
}

void write(const fs::path& slot, const fs::path& rankDir, int rank, int64_t step, bool locked,
           CopyReport& report) {
  try {
    fs::create_directories(rankDir);
    {
      std::optional<SlotReadLock> lock;
      if (locked) lock.emplace(slot);
      copyIn(slot, rankDir, step);
    }
    commit(rankDir, step);
    report.copied.emplace_back(rank, step);
  } catch (const std::exception& e) {
    report.problems.push_back("rank " + std::to_string(rank) + ": " + e.what());
  }
}

}  // namespace

std::optional<int64_t> newestInCommon(const std::map<int, std::set<int64_t>>& wholeByRank,
                                      int worldSize) {
  const auto first = wholeByRank.find(0);
  if (first == wholeByRank.end()) return std::nullopt;
  for (auto it = first->second.rbegin(); it != first->second.rend(); ++it) {
    bool everywhere = true;
    for (int r = 1; r < worldSize && everywhere; ++r) {
      const auto other = wholeByRank.find(r);
      everywhere = other != wholeByRank.end() && other->second.contains(*it);
    }
    if (everywhere) return *it;
  }
  return std::nullopt;
}

std::set<int64_t> stepsToRemove(const std::map<int, std::set<int64_t>>& wholeByRank, int rank,
                                int worldSize) {
  const auto mine = wholeByRank.find(rank);
  if (mine == wholeByRank.end()) return {};
  const std::optional<int64_t> common = newestInCommon(wholeByRank, worldSize);
  std::set<int64_t> removed;
  size_t newer = 0;  // of the rank's steps, how many are newer than the one looked at
  for (auto it = mine->second.rbegin(); it != mine->second.rend(); ++it, ++newer)
    if ((common && *it < *common) || (*it != common && newer >= kNewestKept)) removed.insert(*it);
  return removed;
}

CopyReport flushCheckpoints(const fs::path& memory, const fs::path& dir, int worldSize) {
  CopyReport report;
  const auto ranks = ranksIn(memory);
  for (const auto& [rank, memoryRank] : ranks) {
    const fs::path rankDir = rankDirOf(dir, rank);
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(rankDir, ec))  // an end cut short
      if (entry.path().filename().string().starts_with(".step-")) fs::remove_all(entry.path(), ec);
    for (const fs::path& slot : slotsOf(memoryRank))
      if (const auto step = readMark(slot / "step"); step && wanted(dir, rank, worldSize, *step))
        write(slot, rankDir, rank, *step, /*locked=*/false, report);
  }
  for (const auto& [rank, memoryRank] : ranks) prune(dir, rank, worldSize);  // every rank written
  return report;
}

CopyReport writeRequested(const fs::path& memory, const fs::path& dir) {
  CopyReport report;
  forEachRequest(memory, "write", [&](int rank, const fs::path& slot, const std::string& request) {
    const auto line = numberAndWord(request);  // "STEP WORLD_SIZE"
    const auto world = line ? parseInteger<int>(line->second) : std::nullopt;
    if (world && *world > 0 && readMark(slot / "step") == line->first &&
        wanted(dir, rank, *world, line->first)) {
      write(slot, rankDirOf(dir, rank), rank, line->first, /*locked=*/true, report);
      prune(dir, rank, *world);
    }
  });
  return report;
}

}  // namespace dlrun::agents
