#include "trainer/report.h"

#include <cstdio>

namespace dlrun::trainer {

void Reporter::line(const std::string& text) const {
  if (!speaks_) return;
  std::fputs((text + "\n").c_str(), stdout);
  std::fflush(stdout);
}

void Reporter::progress(int epoch, int epochs, int64_t step, int64_t steps, double loss) const {
  char text[160];
  std::snprintf(text, sizeof(text), "epoch %d/%d step %lld/%lld loss %.4f", epoch, epochs,
                static_cast<long long>(step), static_cast<long long>(steps), loss);
  line(text);
}

void Reporter::epoch(const EpochResult& r) const {
  char text[200];
  std::snprintf(text, sizeof(text),
                "epoch %d/%d: train loss %.4f, test accuracy %.4f, %.0f samples/s, %.1f s", r.epoch,
                r.epochs, r.trainLoss, r.testAccuracy, r.samplesPerSecond, r.seconds);
  line(text);
}

void Reporter::resumed(int epoch, int64_t samplesInEpoch, int64_t globalStep) const {
  line("resuming from checkpoint: epoch " + std::to_string(epoch + 1) + ", " +
       std::to_string(samplesInEpoch) + " samples into it, step " + std::to_string(globalStep));
}

void Reporter::summary(const EpochResult& last, int worldSize, int64_t steps,
                       const std::string& device, const std::string& strategy, uint64_t bytesSent,
                       uint64_t bytesReceived) const {
  char text[440];
  std::snprintf(text, sizeof(text),
                "{\"epochs\": %d, \"steps\": %lld, \"world_size\": %d, \"train_loss\": %.6f, "
                "\"test_accuracy\": %.6f, \"samples_per_sec\": %.1f, \"seconds\": %.3f, "
                "\"device\": \"%s\", \"strategy\": \"%s\", \"bytes_sent\": %llu, "
                "\"bytes_received\": %llu}",
                last.epoch, static_cast<long long>(steps), worldSize, last.trainLoss,
                last.testAccuracy, last.samplesPerSecond, last.seconds, device.c_str(),
                strategy.c_str(), static_cast<unsigned long long>(bytesSent),
                static_cast<unsigned long long>(bytesReceived));
  line(text);
}

}  // namespace dlrun::trainer
