// Where a round's workers report their progress, and the agent's look at it twice a second
// (ARCHITECTURE.md section 9). Each round gets a fresh progress board (common/progress_board.h;
// DLRUN_PROGRESS_FILE) beside its logs, and each worker may also name other figures in a small
// JSON file of its own (DLRUN_PROGRESS_FILE.metrics.LOCAL_RANK, which dlrun's Python module
// writes at most once a second). The sampler hands every look to the agent, which tells its
// observers and its hang watch; a worker step costs nothing beyond the board's stores.
//
// Runs on the agent's io_context: a timer, and reads of a mapped file and a few small files.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "agents/worker_env.h"
#include "common/asio.h"
#include "common/progress_board.h"

namespace dlrun::agents {

struct ProgressSample {
  std::vector<ProgressReading> board;                  // by local rank
  std::vector<std::map<std::string, double>> metrics;  // by local rank, by name
  double now = 0;                                      // steady seconds
  double wall = 0;                                     // unix seconds
};

// The directory to add to the workers' PYTHONPATH so that `import dlrun.progress` works: the
// package beside dlrun's build tree, or where the installed package keeps it; empty if neither.
std::string pythonModulesDir();

// Reads one worker's named figures: a JSON object of numbers; anything else gives none.
std::map<std::string, double> parseReportedMetrics(const std::string& text);

class ProgressSampler {
 public:
  static constexpr auto kEvery = std::chrono::milliseconds(500);

  ProgressSampler(boost::asio::io_context& io, std::function<void(const ProgressSample&)> onLook);
  ~ProgressSampler();

  // A round's workers are about to be built: a fresh board for them under `attemptDir`, named
  // to them through `spec`. Throws Error naming the file when it cannot be made.
  void prepareRound(const std::filesystem::path& attemptDir, int workers, RoundSpec& spec);
  const ProgressBoard* board() const { return board_.get(); }

 private:
  void look();
  std::map<std::string, double> readMetrics(int local);

  std::function<void(const ProgressSample&)> onLook_;
  boost::asio::steady_timer timer_;
  std::unique_ptr<ProgressBoard> board_;
  struct MetricsFile {
    std::filesystem::file_time_type changed{};
    std::map<std::string, double> values;
  };
  std::vector<MetricsFile> metrics_;  // by local rank
};

}  // namespace dlrun::agents
