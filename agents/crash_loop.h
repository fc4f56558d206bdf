// The end of a crash loop (docs/guides/fault-tolerance.md): a job whose attempts keep failing
// without its step advancing ends with --no-restart-exit-code's code (93 unless set, the code
// NVIDIA's launchers and schedulers read as "do not requeue") instead of restarting again, and
// says why. Pure: the agent tells it how each failed attempt ended.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dlrun::agents {

// The code a crash loop ends the job with where --no-restart-exit-code is not set.
inline constexpr int kCrashLoopExitCode = 93;
// An attempt that reports no step made progress if it lived this many seconds.
inline constexpr double kCrashLoopShortLife = 60;

struct AttemptEnd {
  uint64_t attempt = 0;         // the agent's count of its attempts
  std::optional<int64_t> step;  // the newest step its workers reported (dlrun.progress)
  double livedSeconds = 0;      // from its start to the failure
};

class CrashLoop {
 public:
  // `attempts`: failed attempts in a row without progress that end the job (0: never). An
  // attempt that reports no step made progress if it lived `shortLife` seconds or more.
  CrashLoop(int attempts, double shortLife) : attempts_(attempts), shortLife_(shortLife) {}

  // The failed attempt that ended (once an attempt: a second call for it changes nothing);
  // true when the last `attempts` made no progress.
  bool ended(const AttemptEnd& attempt);
  // Why, one line: "the last 3 attempts ended without a step past 41".
  std::string describe() const;

 private:
  int attempts_;
  double shortLife_;
  std::optional<uint64_t> last_;  // the attempt counted last
  std::optional<int64_t> best_;   // the newest step any attempt reported
  int stalled_ = 0;               // attempts in a row without progress, to the last
  double longest_ = 0;            // of those with no step reported, the longest life
  bool looping_ = false;
};

}  // namespace dlrun::agents
