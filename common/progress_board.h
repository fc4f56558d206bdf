// The progress board a dlrun agent shares with its workers under --hang-timeout or
// --metrics-port: a small file that both map, one cache line per local worker. A worker reports
// a step with a few stores and no system call, so reporting every step costs nothing
// measurable; the agent reads every worker's slot when it looks, without asking anyone. The file
// is DLRUN_PROGRESS_FILE and a worker's slot is its LOCAL_RANK. Lives in dlrun_common because both
// the agent and the bundled trainer use it.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>

namespace dlrun {

// Where a worker is: computing, or waiting in a collective (where a stuck peer holds it).
enum class ProgressPhase : uint32_t { Computing = 0, Collective = 1 };

// One worker's slot, shared between processes: lock-free atomics only.
struct alignas(64) ProgressSlot {
  std::atomic<uint64_t> beats{0};  // every report bumps it: progress is a change of it
  std::atomic<int64_t> step{0};
  std::atomic<int64_t> epoch{0};
  std::atomic<uint32_t> phase{0};
  // What the worker learned, for --metrics-port: set bits say which results it reported.
  std::atomic<uint32_t> results{0};
  std::atomic<double> loss{0};
  std::atomic<double> accuracy{0};
  std::atomic<int64_t> samples{0};  // examples this worker has trained on
};
static_assert(sizeof(ProgressSlot) == 64);
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
              std::atomic<int64_t>::is_always_lock_free &&
              std::atomic<uint32_t>::is_always_lock_free &&
              std::atomic<double>::is_always_lock_free);

inline constexpr uint32_t kReportedLoss = 1;
inline constexpr uint32_t kReportedAccuracy = 2;

struct ProgressReading {
  uint64_t beats = 0;  // 0: nothing reported yet
  int64_t step = 0;
  int64_t epoch = 0;
  ProgressPhase phase = ProgressPhase::Computing;
  uint32_t results = 0;  // kReportedLoss | kReportedAccuracy
  double loss = 0;
  double accuracy = 0;
  int64_t samples = 0;
};

// The worker's side. Inactive (every call a no-op) when DLRUN_PROGRESS_FILE is not set: a run
// outside dlrun, or without --hang-timeout.
class ProgressReporter {
 public:
  // Throws ConfigError when DLRUN_PROGRESS_FILE or LOCAL_RANK is set but unusable.
  static ProgressReporter fromEnvironment();
  ProgressReporter() = default;
  ProgressReporter(ProgressReporter&& other) noexcept;
  ProgressReporter& operator=(ProgressReporter&& other) noexcept;
  ~ProgressReporter();

  void step(int64_t step, int64_t epoch);  // a step begins (or ends): progress
  void phase(ProgressPhase phase);         // entering or leaving a collective: progress too
  // A step's loss and the examples trained on so far; an epoch's test accuracy. Relaxed
  // stores, read only by --metrics-port's sampler: no beat, no ordering.
  void loss(double loss, int64_t samples);
  void accuracy(double accuracy);
  bool active() const { return slot_ != nullptr; }

 private:
  ProgressReporter(void* map, size_t size, ProgressSlot* slot)
      : map_(map), size_(size), slot_(slot) {}
  void* map_ = nullptr;
  size_t size_ = 0;
  ProgressSlot* slot_ = nullptr;
};

// The agent's side: creates the file with `workers` zeroed slots and maps it. One board a
// round, so nothing a worker of the round before wrote is read as progress.
class ProgressBoard {
 public:
  // Throws Error naming the file when it cannot be created or mapped.
  ProgressBoard(std::filesystem::path path, int workers);
  ~ProgressBoard();  // unmaps and removes the file
  ProgressBoard(const ProgressBoard&) = delete;
  ProgressBoard& operator=(const ProgressBoard&) = delete;

  const std::filesystem::path& path() const { return path_; }
  int workers() const { return workers_; }
  ProgressReading read(int localRank) const;

 private:
  std::filesystem::path path_;
  int workers_ = 0;
  void* map_ = nullptr;
  size_t size_ = 0;
};

}  // namespace dlrun
