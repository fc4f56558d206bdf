// Each rank's pace, from what the agent reads of its workers' progress board: the steps a second
// over the last few seconds and the time since its last new step, as the agent publishes them
// for the job's view (control/state/progress_record.h). Pure: time comes from the caller.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/progress_board.h"
#include "control/state/progress_record.h"

namespace dlrun::agents {

class RankRates {
 public:
  static constexpr double kWindow = 5;  // seconds a rate is taken over
  static constexpr double kSettle = 2;  // seconds of reports before a rate is known

  // A new round: `workers` local ranks from `baseRank`.
  void reset(int round, int baseRank, int workers);
  // Seconds between the records the publisher writes, said in each (NodeProgress::period).
  void period(double seconds) { period_ = seconds; }
  // One look at the board (by local rank) and at what the ranks reported by name, at `now`
  // (steady seconds) and `wall` (unix seconds): the record of the ranks that reported.
  control::NodeProgress observe(const std::vector<ProgressReading>& board,
                                const std::vector<std::map<std::string, double>>& metrics,
                                double now, double wall);

 private:
  struct Track {
    std::deque<std::pair<double, int64_t>> seen;  // (time, step) within the window
    double firstReport = -1;
    double lastStep = -1;  // when the step last changed
    int64_t step = 0;
  };
  int round_ = -1;
  int baseRank_ = 0;
  double period_ = 1;
  std::vector<Track> tracks_;
};

// Whether `next` is worth writing over `last`, written at `lastTime`: a step or a result
// changed, or it has been `refresh` seconds (a rank that stopped still shows its age).
bool progressChanged(const control::NodeProgress& last, const control::NodeProgress& next,
                     double refresh);

}  // namespace dlrun::agents
