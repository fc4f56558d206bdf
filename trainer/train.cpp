#include "trainer/train.h"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "rendezvous/prefix_store.h"
#include "rendezvous/tcp_store.h"
#include "trainer/checkpoint.h"
#include "trainer/collective.h"
#include "trainer/model.h"
#include "trainer/report.h"

namespace dlrun::trainer {
namespace {

using Clock = std::chrono::steady_clock;

volatile sig_atomic_t stopRequested = 0;
volatile sig_atomic_t stepping = 0;  // the training loop runs: a stop waits for the step's end

void requestStop(int number) {
  // Before the loop (loading the data, connecting to the other ranks, where a rank that has
  // already failed makes the wait endless) there is nothing to save: SIGTERM ends the process
  // at once, as by default, instead of after dlrun's stop timeout.
  if (number == SIGTERM && !stepping) {
    ::signal(SIGTERM, SIG_DFL);
    ::raise(SIGTERM);  // delivered when the handler returns
    return;
  }
  stopRequested = 1;
}

std::unique_ptr<Collective> connect(const Placement& p) {
  if (p.worldSize == 1) return makeSoloCollective();
  auto tcp = std::make_shared<rendezvous::TcpStore>(
      rendezvous::TcpStoreOptions{.host = p.masterAddr, .port = p.masterPort});
  // A restarted group must not read the addresses its previous attempt published.
  auto store = std::make_shared<rendezvous::PrefixStore>(
      "dlrun-train/attempt_" + std::to_string(p.restartCount), tcp);
  return makeGlooCollective(store, p.rank, p.worldSize,
                            localAddressToward(p.masterAddr, p.masterPort));
}

// Rank 0's checkpoint, sent to every rank (a sum where the others contribute zeros), so ranks
// on nodes without a shared directory resume from the same state.
std::optional<Checkpoint> resume(const TrainConfig& config, Collective& collective,
                                 Mlp& model, Sgd& sgd) {
  if (config.checkpointDir.empty()) return std::nullopt;
  std::optional<Checkpoint> found;
  if (collective.rank() == 0) found = loadNewestCheckpoint(config.checkpointDir);
  if (found && found->widths != model.shape().widths())
    throw Error("the checkpoint in " + config.checkpointDir + " is for another model shape");
  std::vector<float> header = {found ? 1.0f : 0.0f,
                               found ? static_cast<float>(found->epoch) : 0.0f};
  collective.allreduceSum(header.data(), header.size());
  if (header[0] == 0.0f) return std::nullopt;
  Checkpoint c;
  c.epoch = static_cast<int>(header[1]);
  // Positions travel as doubles split in float-exact halves to stay exact past 2^24.
  std::vector<float> position(4, 0.0f);
  if (found) {
    position = {static_cast<float>(found->samplesInEpoch >> 20),
                static_cast<float>(found->samplesInEpoch & 0xFFFFF),
                static_cast<float>(found->globalStep >> 20),
                static_cast<float>(found->globalStep & 0xFFFFF)};
    model.params() = found->params;
    sgd.velocity() = found->velocity;
  } else {
    std::fill(model.params().begin(), model.params().end(), 0.0f);
    std::fill(sgd.velocity().begin(), sgd.velocity().end(), 0.0f);
  }
  collective.allreduceSum(position.data(), position.size());
  collective.allreduceSum(model.params().data(), model.params().size());
  collective.allreduceSum(sgd.velocity().data(), sgd.velocity().size());
  c.samplesInEpoch = (static_cast<int64_t>(position[0]) << 20) + static_cast<int64_t>(position[1]);
  c.globalStep = (static_cast<int64_t>(position[2]) << 20) + static_cast<int64_t>(position[3]);
  return c;
}

double testAccuracy(Mlp& model, const Dataset& test, Collective& collective) {
  // Each rank scores a contiguous slice; the counts are summed.
  const int per = (test.rows + collective.size() - 1) / collective.size();
  const int begin = std::min(test.rows, collective.rank() * per);
  const int end = std::min(test.rows, begin + per);
  constexpr int kChunk = 1000;
  float counts[2] = {0.0f, static_cast<float>(end - begin)};
  for (int i = begin; i < end; i += kChunk) {
    const int n = std::min(kChunk, end - i);
    counts[0] += static_cast<float>(model.countCorrect(
        test.images.data() + static_cast<size_t>(i) * test.features, test.labels.data() + i, n));
  }
  collective.allreduceSum(counts, 2);
  return counts[1] > 0 ? counts[0] / counts[1] : 0.0;
}

}  // namespace

int train(const TrainConfig& config, const Placement& placement) {
  ::signal(SIGUSR1, requestStop);
  ::signal(SIGTERM, requestStop);
  const Split data = config.synthetic ? syntheticData(20000, 4000, 784, config.seed)
                                      : loadFashionMnist(config.dataDir);
  if (!config.checkpointDir.empty() && placement.rank == 0) {
    // Fail at once, not at the first checkpoint, when the directory cannot be written.
    std::error_code ec;
    std::filesystem::create_directories(config.checkpointDir, ec);
    std::ofstream probe(config.checkpointDir + "/.writable");
    if (!probe) throw Error("cannot write checkpoints to " + config.checkpointDir);
    probe.close();
    std::filesystem::remove(config.checkpointDir + "/.writable", ec);
  }
  auto collective = connect(placement);
  const int world = collective->size(), rank = collective->rank();
  Mlp model({data.train.features, config.hidden, data.train.classes}, config.seed);
  Sgd sgd({config.learningRate, config.momentum, config.weightDecay}, model.params().size());
  const Reporter report(rank == 0);

  int startEpoch = 0;
  int64_t skipSamples = 0, step = 0;
  if (auto resumed = resume(config, *collective, model, sgd)) {
    startEpoch = resumed->epoch;
    skipSamples = resumed->samplesInEpoch;
    step = resumed->globalStep;
    report.resumed(startEpoch, skipSamples, step);
  }

  const size_t n = model.params().size();
  std::vector<float> exchange(n + 2);  // gradients, then the loss and the stop votes
  std::vector<float> batchX(static_cast<size_t>(config.batchSize) * data.train.features);
  std::vector<uint8_t> batchY(config.batchSize);
  const auto started = Clock::now();
  EpochResult last;
  auto checkpoint = [&](int epoch, int64_t samples) {
    if (rank == 0 && !config.checkpointDir.empty())
      saveCheckpoint(config.checkpointDir,
                     {epoch, samples, step, model.shape().widths(), model.params(), sgd.velocity()});
  };

  // A run resumed at or past --max-steps has no step left to take.
  bool stopping = config.maxSteps >= 0 && step >= config.maxSteps;
  stepping = 1;
  for (int epoch = startEpoch; epoch < config.epochs && !stopping; ++epoch) {
    const auto shard = shardForEpoch(data.train.rows, world, rank, config.seed, epoch);
    const int64_t steps = (static_cast<int64_t>(shard.size()) + config.batchSize - 1) / config.batchSize;
    const int64_t globalBatch = static_cast<int64_t>(config.batchSize) * world;
    const int64_t first = epoch == startEpoch ? skipSamples / globalBatch : 0;
    const auto epochStart = Clock::now();
    double lossSum = 0;
    int64_t stepsRun = 0, samples = 0;
    bool epochDone = true;
    for (int64_t s = first; s < steps; ++s) {
      const size_t begin = static_cast<size_t>(s) * config.batchSize;
      const int b = static_cast<int>(std::min<size_t>(config.batchSize, shard.size() - begin));
      for (int i = 0; i < b; ++i) {
        const int row = shard[begin + i];
        std::copy_n(data.train.images.data() + static_cast<size_t>(row) * data.train.features,
                    data.train.features,
                    batchX.data() + static_cast<size_t>(i) * data.train.features);
        batchY[i] = data.train.labels[row];
      }
      if (config.cosine) {
        // By the fraction of the run done, so any world size follows the same curve.
        const double progress = (epoch + static_cast<double>(s) / steps) / config.epochs;
        sgd.setLearningRate(static_cast<float>(config.learningRate * 0.5 *
                                               (1.0 + std::cos(M_PI * progress))));
      }
      const float loss = model.lossAndGradient(batchX.data(), batchY.data(), b);
      std::copy(model.grads().begin(), model.grads().end(), exchange.begin());
      exchange[n] = loss;
      exchange[n + 1] = stopRequested ? 1.0f : 0.0f;
      collective->allreduceSum(exchange.data(), exchange.size());
      // The mean gradient over the global batch, applied in the same pass as the update.
      const float scale = 1.0f / static_cast<float>(world);
      sgd.step(model.params(), exchange.data(), scale);
      ++step;
      ++stepsRun;
      lossSum += exchange[n] * scale;
      samples += static_cast<int64_t>(b) * world;
      if ((s + 1) % config.progressEvery == 0)
        report.progress(epoch + 1, config.epochs, s + 1, steps, exchange[n] * scale);
      const bool lastStep = s + 1 == steps;
      if (config.checkpointEvery > 0 && step % config.checkpointEvery == 0 && !lastStep)
        checkpoint(epoch, (s + 1) * globalBatch);
      if (step == config.failAtStep && rank == std::min(1, world - 1) &&
          placement.restartCount == 0) {
        // The testing aid (--fail-at-step): a worker that dies mid-run.
        std::fprintf(stderr, "dlrun-train: --fail-at-step %lld: rank %d exits with code 1\n",
                     static_cast<long long>(step), rank);
        std::fflush(stdout);
        std::fflush(stderr);
        std::_Exit(1);
      }
      // Every rank sees the same votes, so all stop after the same step.
      if (exchange[n + 1] > 0.0f || (config.maxSteps >= 0 && step >= config.maxSteps)) {
        stopping = true;
        epochDone = lastStep;
        if (!lastStep) checkpoint(epoch, (s + 1) * globalBatch);
        break;
      }
    }
    const auto now = Clock::now();
    const double epochSeconds = std::chrono::duration<double>(now - epochStart).count();
    last = {epoch + 1,
            config.epochs,
            stepsRun > 0 ? lossSum / static_cast<double>(stepsRun) : 0.0,
            testAccuracy(model, data.test, *collective),
            epochSeconds > 0 ? static_cast<double>(samples) / epochSeconds : 0.0,
            std::chrono::duration<double>(now - started).count()};
    report.epoch(last);
    if (epochDone) checkpoint(epoch + 1, 0);
  }
  if (last.epoch == 0) {
    // Nothing was left to train (resumed from the end of a finished run, or at --max-steps):
    // the summary still reports the model's accuracy, not zeros.
    last = {std::min(startEpoch + 1, config.epochs), config.epochs, 0.0,
            testAccuracy(model, data.test, *collective), 0.0,
            std::chrono::duration<double>(Clock::now() - started).count()};
  }
  report.summary(last, world, step);
  if (rank == 0 && !config.dumpWeights.empty()) {
    std::ofstream out(config.dumpWeights, std::ios::binary);
    out.write(reinterpret_cast<const char*>(model.params().data()),
              static_cast<std::streamsize>(n * sizeof(float)));
    if (!out) throw Error("cannot write " + config.dumpWeights);
  }
  return 0;
}

}  // namespace dlrun::trainer
