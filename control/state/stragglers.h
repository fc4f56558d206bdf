// Stragglers: ranks that step slower than the rest of the job (ARCHITECTURE.md section 10). A
// rank is named when its step rate stays below `fraction` of the ranks' median for `window`
// seconds, and cleared when it comes back up to it. Pure: the rule, run by group rank 0's agent
// over every agent's progress record (progress_record.h), and the list it keeps in the store
// under ctl/stragglers for every view of the job to show.
//
// A rank's rate is its own steps a second. Ranks that wait for each other every step (DDP's
// all-reduce) share one rate, so a slow one there slows the job as a whole and none is named:
// the rule finds the ranks whose work is their own (data loading, evaluation, local steps).
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dlrun::control {

struct StragglerRule {
  double fraction = 0.7;  // of the median rate; 0: never name one
  double window = 30;     // seconds below it before a rank is named
};

struct RankRate {
  int rank = 0;
  std::string node;            // its host's name, for people
  double stepsPerSecond = -1;  // < 0: not known yet (the rank only just began)
};

struct Straggler {
  int rank = 0;
  std::string node;
  double stepsPerSecond = 0;
  double median = 0;
  double below = 0;  // when it fell below (the caller's clock)
};

struct StragglerChanges {
  std::vector<Straggler> named;
  // Back up to pace, or gone from the round (its stepsPerSecond then < 0).
  std::vector<Straggler> cleared;
};

// The median of `values` (0 when empty).
double median(std::vector<double> values);

class StragglerTracker {
 public:
  explicit StragglerTracker(StragglerRule rule) : rule_(rule) {}

  // One look at every rank of the round at `now` (seconds, any fixed origin): who was named or
  // cleared by it. Ranks not in `ranks` are forgotten. Without a median to judge by (fewer than
  // two known paces, or a median of 0) nobody is named or cleared but for ranks gone.
  StragglerChanges observe(const std::vector<RankRate>& ranks, double now);
  // The ranks named now, by rank.
  const std::map<int, Straggler>& named() const { return named_; }
  void reset();  // a new round: its ranks start afresh

 private:
  StragglerRule rule_;
  std::map<int, double> below_;  // rank -> when its rate fell below the line
  std::map<int, Straggler> named_;
};

// One line for people: "rank 5 on node3 at 0.41 steps/s, 0.30 of the median 1.37, for 31 s".
std::string describe(const Straggler& straggler, double now);

// The list under ctl/stragglers.
std::string encodeStragglers(const std::map<int, Straggler>& named);
// Throws ProtocolError for text that is not one.
std::vector<Straggler> decodeStragglers(std::string_view text);

}  // namespace dlrun::control
