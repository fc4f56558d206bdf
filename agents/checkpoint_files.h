// How the agent reads dlrun.checkpoint's copies in the node's memory (checkpoint_memory.h;
// python/dlrun/checkpoint.py writes them): rank-R/slot-K/{tensors,meta,step}, whole once `step`
// ("STEP CHECKSUM\n") exists, and the requests a worker leaves beside a copy ("STEP WORD\n":
// `write` for --checkpoint-dir, checkpoint_flush.h; `replicate` for a peer node,
// checkpoint_peer.h). While the agent reads a slot it holds a shared flock on its `lock`; a
// worker takes it exclusively before it writes the slot again.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dlrun::agents {

// The files of a copy, `step` last: the copy's mark.
inline constexpr const char* kCopyFiles[] = {"tensors", "meta", "step"};

struct CopyReport {
  std::vector<std::pair<int, int64_t>> copied;  // (rank, step) of each copy written or sent
  std::vector<std::string> problems;            // one line each: a copy that could not be
};

// "NUMBER WORD\n", a mark's or a request's line: the number (0 or more) and the word (pure).
std::optional<std::pair<int64_t, std::string>> numberAndWord(const std::string& line);

// The step a copy's mark names ("STEP CHECKSUM"), nothing for anything else (pure).
std::optional<int64_t> markedStep(const std::string& mark);

std::optional<std::string> readText(const std::filesystem::path& file);
// The step the mark file names, nothing where there is none (a copy not whole).
std::optional<int64_t> readMark(const std::filesystem::path& file);

// A request handled: removed, unless asked again meanwhile (a newer step: it stays for the next
// pass). The worker waits for its request to go before it writes the slot again.
void doneWith(const std::filesystem::path& request, const std::string& asked);

// N of a path named PREFIXN, nothing for another name.
std::optional<int> numbered(const std::filesystem::path& path, std::string_view prefix);

// The ranks in `memory`: (rank, its directory there).
std::vector<std::pair<int, std::filesystem::path>> ranksIn(const std::filesystem::path& memory);
// A rank's slots (slot-K) in its directory in memory.
std::vector<std::filesystem::path> slotsOf(const std::filesystem::path& memoryRank);

// Every request file `name` beside a copy in `memory`, each rank's slots in turn: `handle` gets
// the rank, the slot and the request's line, then the request is done with (doneWith).
void forEachRequest(const std::filesystem::path& memory, const std::string& name,
                    const std::function<void(int rank, const std::filesystem::path& slot,
                                             const std::string& request)>& handle);

// A shared flock on a slot's `lock` while the agent reads the slot: its worker waits for it
// before it writes the slot again.
class SlotReadLock {
 public:
  explicit SlotReadLock(const std::filesystem::path& slot);
  ~SlotReadLock();
  SlotReadLock(const SlotReadLock&) = delete;
  SlotReadLock& operator=(const SlotReadLock&) = delete;

 private:
  int fd_;
};

}  // namespace dlrun::agents
