#include "trainer/train.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "store/address.h"
#include "store/prefix_store.h"
#include "store/tcp_store.h"
#include "trainer/checkpoint.h"
#include "trainer/collective.h"
#include "trainer/engine.h"
#include "trainer/engine_factory.h"
#include "trainer/job_data.h"
#include "trainer/metrics_file.h"
#include "trainer/ps_engine.h"
#include "trainer/ps_server.h"
#include "trainer/report.h"
#include "trainer/shm_collective.h"
#include "trainer/traffic.h"

namespace dlrun::trainer {
namespace {

volatile sig_atomic_t stopRequested = 0;
volatile sig_atomic_t stepping = 0;  // the training loop runs: a stop waits for the step's end
// How long a SIGTERM waits for the ranks to agree on their last step, in whole seconds (2 s
// and four steps' time, from the loop).
volatile sig_atomic_t stopGraceSeconds = 2;

void endAsTerminated(int) {
  ::signal(SIGTERM, SIG_DFL);
  ::raise(SIGTERM);  // delivered when the handler returns
}

void requestStop(int number) {
  // Before the loop (loading the data, connecting to the other ranks, where a rank that has
  // already failed makes the wait endless) there is nothing to save: SIGTERM ends the process
  // at once, as by default, instead of after dlrun's stop timeout.
  if (number == SIGTERM && !stepping) return endAsTerminated(number);
  // In it, the step's all-reduce carries the vote; one waiting on a peer that went silent (a
  // host lost whose connections never closed) waits out gloo's timeout (30 s): past the grace
  // the process ends as SIGTERM ends it, saving nothing (the loop disarms it once the ranks
  // agreed to stop).
  if (number == SIGTERM) {
    ::signal(SIGALRM, endAsTerminated);
    ::alarm(static_cast<unsigned>(stopGraceSeconds));
  }
  stopRequested = 1;
}

// The job's store, namespaced per attempt (a restarted group must not read what its previous
// attempt published); null when alone.
std::shared_ptr<Store> jobStore(const Placement& p) {
  if (p.worldSize == 1) return nullptr;
  // No reconnecting: a store that went away went with its node, which ends the round; a call
  // retrying for a minute would hold the step, and with it the worker's stop (SIGTERM waits for
  // the step's end), past the agent's stop timeout.
  auto tcp = std::make_shared<TcpStore>(
      TcpStoreOptions{.at = {p.masterAddr, p.masterPort}, .reconnect = false});
  return std::make_shared<PrefixStore>("dlrun-train/attempt_" + std::to_string(p.restartCount),
                                       tcp);
}

std::unique_ptr<Collective> connect(const Placement& p, const std::shared_ptr<Store>& store,
                                    bool glooOnly) {
  if (!store) return makeSoloCollective();
  // A job on one machine sums through shared memory where it can.
  if (p.localWorldSize == p.worldSize && !glooOnly) {
    if (auto shared = makeSharedMemoryCollective(*store, p.rank, p.worldSize)) {
      log::debug("all-reduce: shared memory");
      return shared;
    }
  }
  log::debug("all-reduce: Gloo over TCP");
  return makeGlooCollective(store, p.rank, p.worldSize,
                            localAddressToward(p.masterAddr, p.masterPort));
}

// Fails at once, not at the first checkpoint, when the directory cannot be written.
void requireWritable(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::ofstream probe(dir + "/.writable");
  if (!probe) throw Error("cannot write checkpoints to " + dir);
  probe.close();
  std::filesystem::remove(dir + "/.writable", ec);
}

// Where checkpoints go: the directory, the node's memory, both or neither.
std::vector<std::string> checkpointDirs(const TrainConfig& config) {
  std::vector<std::string> dirs;
  for (const std::string* dir : {&config.memoryCheckpointDir, &config.checkpointDir})
    if (!dir->empty()) dirs.push_back(*dir);
  return dirs;
}

// The newest checkpoint of them all, refused when it is for another model.
std::optional<Checkpoint> loadChecked(const TrainConfig& config, const ModelSpec& spec) {
  std::optional<Checkpoint> newest;
  const size_t n = spec.parameterCount();
  for (const std::string& dir : checkpointDirs(config)) {
    std::optional<Checkpoint> found = loadNewestCheckpoint(dir);
    if (found && (found->widths != spec.signature() || found->params.size() != n ||
                  found->velocity.size() != n))
      throw Error("the checkpoint in " + dir + " is for another model shape");
    if (found && (!newest || found->globalStep > newest->globalStep)) newest = std::move(found);
  }
  return newest;
}

// Rank 0's checkpoint, sent to every rank (a sum where the others contribute zeros), so ranks
// on nodes without a shared directory resume from the same state.
std::optional<Checkpoint> resume(const TrainConfig& config, Collective& collective, Engine& engine,
                                 const ModelSpec& spec) {
  if (checkpointDirs(config).empty()) return std::nullopt;
  const size_t n = spec.parameterCount();
  std::optional<Checkpoint> found;
  if (collective.rank() == 0) found = loadChecked(config, spec);
  std::vector<float> header = {found ? 1.0f : 0.0f,
                               found ? static_cast<float>(found->epoch) : 0.0f};
  collective.allreduceSum(header.data(), header.size());
  if (header[0] == 0.0f) return std::nullopt;
  Checkpoint c;
  c.epoch = static_cast<int>(header[1]);
  // Positions travel as doubles split in float-exact halves to stay exact past 2^24.
  std::vector<float> position(4, 0.0f);
  std::vector<float> params(n, 0.0f), velocity(n, 0.0f);
  if (found) {
    position = {static_cast<float>(found->samplesInEpoch >> 20),
                static_cast<float>(found->samplesInEpoch & 0xFFFFF),
                static_cast<float>(found->globalStep >> 20),
                static_cast<float>(found->globalStep & 0xFFFFF)};
    params = std::move(found->params);
    velocity = std::move(found->velocity);
  }
  collective.allreduceSum(position.data(), position.size());
  collective.allreduceSum(params.data(), params.size());
  collective.allreduceSum(velocity.data(), velocity.size());
  engine.load(params, velocity);
  c.samplesInEpoch = (static_cast<int64_t>(position[0]) << 20) + static_cast<int64_t>(position[1]);
  c.globalStep = (static_cast<int64_t>(position[2]) << 20) + static_cast<int64_t>(position[3]);
  return c;
}

double testAccuracy(Engine& engine, const Dataset& test, Collective& collective) {
  // Each rank scores a contiguous slice; the counts are summed.
  const int per = (test.rows + collective.size() - 1) / collective.size();
  const int begin = std::min(test.rows, collective.rank() * per);
  const int end = std::min(test.rows, begin + per);
  constexpr int kChunk = 1000;
  float counts[2] = {0.0f, static_cast<float>(end - begin)};
  for (int i = begin; i < end; i += kChunk) {
    const int n = std::min(kChunk, end - i);
    counts[0] += static_cast<float>(engine.countCorrect(
        test.images.data() + static_cast<size_t>(i) * test.features, test.labels.data() + i, n));
  }
  collective.allreduceSum(counts, 2);
  return counts[1] > 0 ? counts[0] / counts[1] : 0.0;
}

// One run: set up once (data, the connection to the other ranks, the engine, a resumed
// position), then epochs of steps, then the summary.
class Training {
 public:
  Training(const TrainConfig& config, const Placement& placement);
  void run();

 private:
  // Trains what is left of `epoch`; sets stopping_ when a stop vote or --max-steps ends the run.
  void trainEpoch(int epoch);
  // Gathers this rank's examples shard[begin, begin + batch) and takes one step on them.
  StepResult step(const std::vector<int>& shard, size_t begin, int batch, float learningRate);
  float learningRate(int epoch, int64_t stepInEpoch, int64_t steps) const;
  void checkpoint(int epoch, int64_t samples);
  // --strategy ps: the chief inits the servers (from its checkpoint or the seed's weights);
  // every worker takes their parameters and the position to go on from.
  void joinServers();
  void failIfAsked() const;
  void hangIfAsked() const;
  void finish();
  // A --metrics-file line; `samples` is every rank's since the line before.
  void record(const char* kind, int epoch, double loss, std::optional<double> accuracy,
              int64_t samples, float learningRate);

  const TrainConfig& config_;
  const Placement& placement_;
  const Split data_;
  const ModelSpec spec_;
  std::unique_ptr<Collective> collective_;
  std::unique_ptr<Engine> engine_;
  PsEngine* ps_ = nullptr;  // engine_, under --strategy ps
  // The ranks that train: every rank, or under ps the workers (the chief is 0).
  const int world_, rank_;
  const Reporter report_;
  ProgressReporter progress_ = ProgressReporter::fromEnvironment();
  std::optional<MetricsFile> metricsFile_;  // rank 0's, with --metrics-file
  Clock::time_point lastRecord_;            // when the line before was written
  int64_t ownSamples_ = 0;                  // examples this rank trained on, for the board
  int startEpoch_ = 0;
  int64_t skipSamples_ = 0, step_ = 0;
  bool stopping_ = false;
  std::vector<float> batchX_;
  std::vector<uint8_t> batchY_;
  Clock::time_point started_;
  EpochResult last_;
};

Training::Training(const TrainConfig& config, const Placement& placement)
    : config_(config),
      placement_(placement),
      data_(loadData(config)),
      spec_(modelSpec(config, data_.train)),
      world_(placement.ps ? placement.ps->workers : placement.worldSize),
      rank_(placement.ps ? placement.ps->index : placement.rank),
      report_(rank_ == 0),
      batchX_(static_cast<size_t>(config.batchSize) * data_.train.features),
      batchY_(config.batchSize) {
  if (rank_ == 0)
    for (const std::string& dir : checkpointDirs(config)) requireWritable(dir);
  if (!config.metricsFile.empty() && rank_ == 0) metricsFile_.emplace(config.metricsFile);
  // More servers than parameters is refused before anything connects.
  if (placement.ps) shardRanges(spec_.parameterCount(), placement.ps->servers);
  auto store = jobStore(placement);
  const EngineOptions options{spec_,
                              config.seed,
                              {config.learningRate, config.momentum, config.weightDecay},
                              config.cpuMath};
  if (placement.ps) {
    // Workers exchange nothing with each other: each scores the whole test set alone.
    collective_ = makeSoloCollective();
    auto ps = makePsEngine(options, *placement.ps, *store);
    ps_ = ps.get();
    engine_ = std::move(ps);
    joinServers();
  } else {
    collective_ =
        reportingProgress(connect(placement, store, config.allreduce == "gloo"), progress_);
    engine_ = makeEngine(config.device, options, placement, *collective_, store);
  }
  if (auto resumed = placement.ps ? std::nullopt : resume(config, *collective_, *engine_, spec_)) {
    startEpoch_ = resumed->epoch;
    skipSamples_ = resumed->samplesInEpoch;
    step_ = resumed->globalStep;
    report_.resumed(startEpoch_, skipSamples_, step_);
  }
  // A run resumed at or past --max-steps has no step left to take.
  stopping_ = config.maxSteps >= 0 && step_ >= config.maxSteps;
}

void Training::joinServers() {
  std::optional<Checkpoint> init;
  if (rank_ == 0) {
    init = loadChecked(config_, spec_);
    if (init)
      report_.resumed(init->epoch, init->samplesInEpoch, init->globalStep);
    else
      init = Checkpoint{.params = engine_->params(),
                        .velocity = std::vector<float>(spec_.parameterCount(), 0.0f)};
  }
  const ps::Position at = ps_->join(init);
  startEpoch_ = static_cast<int>(at.epoch);
  skipSamples_ = at.samplesInEpoch;
  step_ = at.step;
}

void Training::run() {
  started_ = Clock::now();
  lastRecord_ = started_;
  stepping = 1;
  for (int epoch = startEpoch_; epoch < config_.epochs && !stopping_; ++epoch) trainEpoch(epoch);
  finish();
}

void Training::trainEpoch(int epoch) {
  const auto shard = shardForEpoch(data_.train.rows, world_, rank_, config_.seed, epoch);
  const int64_t steps =
      (static_cast<int64_t>(shard.size()) + config_.batchSize - 1) / config_.batchSize;
  const int64_t globalBatch = static_cast<int64_t>(config_.batchSize) * world_;
  const int64_t first = epoch == startEpoch_ ? skipSamples_ / globalBatch : 0;
  const auto epochStart = Clock::now();
  double lossSum = 0;
  int64_t stepsRun = 0, samples = 0, samplesSinceRecord = 0;
  bool epochDone = true;
  for (int64_t s = first; s < steps; ++s) {
    const size_t begin = static_cast<size_t>(s) * config_.batchSize;
    const int b = static_cast<int>(std::min<size_t>(config_.batchSize, shard.size() - begin));
    progress_.step(step_ + 1, epoch);
    hangIfAsked();
    if (ps_) ps_->setPosition({epoch, (s + 1) * globalBatch, step_ + 1});
    const float lr = learningRate(epoch, s, steps);
    const auto stepStart = Clock::now();
    const StepResult result = step(shard, begin, b, lr);
    stopGraceSeconds = static_cast<sig_atomic_t>(
        2 + std::ceil(4 * std::chrono::duration<double>(Clock::now() - stepStart).count()));
    ++step_;
    ++stepsRun;
    lossSum += result.loss;
    samples += static_cast<int64_t>(b) * world_;
    samplesSinceRecord += static_cast<int64_t>(b) * world_;
    ownSamples_ += b;
    progress_.loss(result.loss, ownSamples_);
    if ((s + 1) % config_.progressEvery == 0) {
      report_.progress(epoch + 1, config_.epochs, s + 1, steps, result.loss);
      record("step", epoch + 1, result.loss, std::nullopt, samplesSinceRecord, lr);
      samplesSinceRecord = 0;
    }
    const bool lastStep = s + 1 == steps;
    if (config_.checkpointEvery > 0 && step_ % config_.checkpointEvery == 0 && !lastStep)
      checkpoint(epoch, (s + 1) * globalBatch);
    failIfAsked();
    // Every rank sees the same votes, so all stop after the same step.
    if (result.stop || (config_.maxSteps >= 0 && step_ >= config_.maxSteps)) {
      ::alarm(0);  // agreed: the checkpoint below is written whole
      stopping_ = true;
      epochDone = lastStep;
      if (!lastStep) checkpoint(epoch, (s + 1) * globalBatch);
      break;
    }
  }
  const auto now = Clock::now();
  const double epochSeconds = std::chrono::duration<double>(now - epochStart).count();
  last_ = {epoch + 1,
           config_.epochs,
           stepsRun > 0 ? lossSum / static_cast<double>(stepsRun) : 0.0,
           testAccuracy(*engine_, data_.test, *collective_),
           epochSeconds > 0 ? static_cast<double>(samples) / epochSeconds : 0.0,
           std::chrono::duration<double>(now - started_).count()};
  report_.epoch(last_);
  progress_.accuracy(last_.testAccuracy);
  record("epoch", epoch + 1, last_.trainLoss, last_.testAccuracy, samplesSinceRecord,
         learningRate(epoch, steps, steps));
  if (epochDone) checkpoint(epoch + 1, 0);
}

void Training::record(const char* kind, int epoch, double loss, std::optional<double> accuracy,
                      int64_t samples, float learningRate) {
  if (!metricsFile_) return;
  const auto now = Clock::now();
  const double since = std::chrono::duration<double>(now - lastRecord_).count();
  lastRecord_ = now;
  metricsFile_->write({.kind = kind,
                       .time = unixSeconds(),
                       .elapsed = std::chrono::duration<double>(now - started_).count(),
                       .step = step_,
                       .epoch = epoch,
                       .loss = loss,
                       .accuracy = accuracy,
                       .samplesPerSecond = since > 0 ? static_cast<double>(samples) / since : 0.0,
                       .learningRate = learningRate,
                       .worldSize = world_,
                       .restart = placement_.restartCount});
}

StepResult Training::step(const std::vector<int>& shard, size_t begin, int batch,
                          float learningRate) {
  const int features = data_.train.features;
  for (int i = 0; i < batch; ++i) {
    const int row = shard[begin + i];
    std::copy_n(data_.train.images.data() + static_cast<size_t>(row) * features, features,
                batchX_.data() + static_cast<size_t>(i) * features);
    batchY_[i] = data_.train.labels[row];
  }
  return engine_->step(batchX_.data(), batchY_.data(), batch, learningRate, stopRequested != 0);
}

float Training::learningRate(int epoch, int64_t stepInEpoch, int64_t steps) const {
  if (!config_.cosine) return config_.learningRate;
  // By the fraction of the run done, so any world size follows the same curve.
  const double progress = (epoch + static_cast<double>(stepInEpoch) / steps) / config_.epochs;
  return static_cast<float>(config_.learningRate * 0.5 * (1.0 + std::cos(M_PI * progress)));
}

void Training::checkpoint(int epoch, int64_t samples) {
  if (rank_ != 0) return;
  for (const std::string& dir : checkpointDirs(config_))
    saveCheckpoint(
        dir, {epoch, samples, step_, spec_.signature(), engine_->params(), engine_->velocity()});
}

// The testing aid (--fail-at-step): a worker that dies mid-run.
void Training::failIfAsked() const {
  if (step_ != config_.failAtStep || rank_ != std::min(1, world_ - 1) ||
      placement_.restartCount != 0)
    return;
  std::fprintf(stderr, "dlrun-train: --fail-at-step %lld: rank %d exits with code 1\n",
               static_cast<long long>(step_), rank_);
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(1);
}

// Out of line and named, so the stack a hang report takes shows it.
[[gnu::noinline]] void sleepForeverForTesting() {
  while (true) std::this_thread::sleep_for(std::chrono::hours(1));
}

// The testing aid (--hang-at-step): a rank stuck before its all-reduce.
void Training::hangIfAsked() const {
  if (step_ + 1 != config_.hangAtStep || rank_ != world_ - 1 || placement_.restartCount != 0)
    return;
  std::fprintf(stderr, "dlrun-train: --hang-at-step %lld: rank %d sleeps for ever\n",
               static_cast<long long>(config_.hangAtStep), rank_);
  std::fflush(stderr);
  sleepForeverForTesting();
}

void Training::finish() {
  if (last_.epoch == 0) {
    // Nothing was left to train (resumed from the end of a finished run, or at --max-steps):
    // the summary still reports the model's accuracy, not zeros.
    last_ = {std::min(startEpoch_ + 1, config_.epochs),
             config_.epochs,
             0.0,
             testAccuracy(*engine_, data_.test, *collective_),
             0.0,
             std::chrono::duration<double>(Clock::now() - started_).count()};
  }
  if (ps_) ps_->done();
  const Traffic traffic = tcpTraffic();
  report_.summary(last_, world_, step_, engine_->device(), config_.strategy, traffic.sent,
                  traffic.received);
  // Under ps every worker's traffic differs (the chief's summary says its own): each says it.
  if (ps_ && rank_ != 0) {
    std::printf(
        "{\"strategy\": \"ps\", \"role\": \"worker\", \"index\": %d, \"steps\": %lld, "
        "\"bytes_sent\": %llu, \"bytes_received\": %llu}\n",
        rank_, static_cast<long long>(step_), static_cast<unsigned long long>(traffic.sent),
        static_cast<unsigned long long>(traffic.received));
    std::fflush(stdout);
  }
  if (rank_ == 0 && !config_.dumpWeights.empty()) {
    const std::vector<float> params = engine_->params();
    std::ofstream out(config_.dumpWeights, std::ios::binary);
    out.write(reinterpret_cast<const char*>(params.data()),
              static_cast<std::streamsize>(params.size() * sizeof(float)));
    if (!out) throw Error("cannot write " + config_.dumpWeights);
  }
}

}  // namespace

int train(const TrainConfig& config, const Placement& placement) {
  if (placement.ps && placement.ps->server) {
    // A server saves nothing: SIGTERM ends it as by default.
    servePs(config, placement, *placement.ps, [&] { return jobStore(placement); });
    return 0;
  }
  ::signal(SIGUSR1, requestStop);
  ::signal(SIGTERM, requestStop);
  Training(config, placement).run();
  return 0;
}

}  // namespace dlrun::trainer
