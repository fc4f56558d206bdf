// What rank 0 tells the user: progress lines during an epoch, one line per epoch, and a final
// JSON summary line. Other ranks stay quiet.
#pragma once

#include <cstdint>
#include <string>

namespace dlrun::trainer {

struct EpochResult {
  int epoch = 0;  // 1-based
  int epochs = 0;
  double trainLoss = 0;
  double testAccuracy = 0;
  double samplesPerSecond = 0;
  double seconds = 0;  // since training started
};

class Reporter {
 public:
  explicit Reporter(bool speaks) : speaks_(speaks) {}
  void progress(int epoch, int epochs, int64_t step, int64_t steps, double loss) const;
  void epoch(const EpochResult& result) const;
  void resumed(int epoch, int64_t samplesInEpoch, int64_t globalStep) const;
  // {"epochs":..,"test_accuracy":..,"samples_per_sec":..,...,"device":"cpu" or "cuda",
  //  "strategy":"allreduce" or "ps","bytes_sent":..,"bytes_received":..} (this process's)
  void summary(const EpochResult& last, int worldSize, int64_t steps, const std::string& device,
               const std::string& strategy, uint64_t bytesSent, uint64_t bytesReceived) const;

 private:
  void line(const std::string& text) const;
  bool speaks_;
};

}  // namespace dlrun::trainer
