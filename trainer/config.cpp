#include "trainer/config.h"

#include <CLI/CLI.hpp>
#include <cstdlib>

#include "common/cli.h"
#include "common/error.h"
#include "common/text.h"
#include "common/version.h"

namespace dlrun::trainer {
namespace {

std::optional<int64_t> envInt(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr) return std::nullopt;
  const auto value = parseInteger<int64_t>(text);
  if (!value) throw ConfigError(std::string(name) + "='" + text + "' is not an integer");
  return value;
}

Placement placementFromEnvironment() {
  Placement p;
  auto rank = envInt("RANK"), world = envInt("WORLD_SIZE");
  if (!rank || !world)
    throw ConfigError(
        "RANK and WORLD_SIZE are not set: start it with dlrun, e.g. "
        "'dlrun --standalone --nproc-per-node=4 train', or pass --single to train alone");
  if (*world < 1 || *rank < 0 || *rank >= *world)
    throw ConfigError("RANK=" + std::to_string(*rank) +
                      " does not fit WORLD_SIZE=" + std::to_string(*world));
  p.rank = static_cast<int>(*rank);
  p.worldSize = static_cast<int>(*world);
  // Without the local variables, the whole job is taken to share this node.
  p.localRank = static_cast<int>(envInt("LOCAL_RANK").value_or(p.rank));
  p.localWorldSize = static_cast<int>(envInt("LOCAL_WORLD_SIZE").value_or(p.worldSize));
  if (p.localWorldSize < 1 || p.localRank < 0 || p.localRank >= p.localWorldSize)
    throw ConfigError("LOCAL_RANK=" + std::to_string(p.localRank) +
                      " does not fit LOCAL_WORLD_SIZE=" + std::to_string(p.localWorldSize));
  p.restartCount = static_cast<int>(envInt("TORCHELASTIC_RESTART_COUNT").value_or(0));
  if (p.worldSize > 1) {
    const char* addr = std::getenv("MASTER_ADDR");
    auto port = envInt("MASTER_PORT");
    if (addr == nullptr || !port || *port < 1 || *port > 65535)
      throw ConfigError("MASTER_ADDR and MASTER_PORT must name the job's store");
    p.masterAddr = addr;
    p.masterPort = static_cast<uint16_t>(*port);
  }
  return p;
}

}  // namespace

TrainParse parseTrainArgs(const std::vector<std::string>& args) {
  TrainParse result;
  TrainConfig& c = result.config;
  CLI::App app(
      "dlrun-train: data-parallel training (an MLP or a CNN) on Fashion-MNIST, the bundled\n"
      "worker of dlrun. Start it as 'dlrun --standalone --nproc-per-node=N train [flags]'.",
      "dlrun-train");
  app.option_defaults()->always_capture_default();
  app.add_option("--epochs", c.epochs, "Passes over the training set")
      ->check(CLI::Range(1, 100000));
  app.add_option("--batch-size", c.batchSize, "Examples per rank per step")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--lr", c.learningRate, "Learning rate for the global batch")
      ->check(CLI::Range(0.0f, 100.0f));
  std::string schedule = "cosine";
  app.add_option("--lr-schedule", schedule, "cosine (to zero over the run) or constant")
      ->check(CLI::IsMember({"cosine", "constant"}));
  app.add_option("--momentum", c.momentum, "SGD momentum")->check(CLI::Range(0.0f, 1.0f));
  app.add_option("--weight-decay", c.weightDecay, "L2 weight decay")->check(CLI::Range(0.0f, 1.0f));
  app.add_option("--model", c.model,
                 "mlp (two hidden layers) or cnn (two convolutions with pooling, then two dense "
                 "layers; 8 epochs unless --epochs says otherwise)")
      ->check(CLI::IsMember({"mlp", "cnn"}));
  app.add_option("--hidden", c.hidden, "The MLP's hidden layer widths, e.g. --hidden 256 128")
      ->check(CLI::Range(1, 1 << 16));
  app.add_option("--seed", c.seed, "Seed of the initial weights and the data order");
  app.add_option("--data-dir,--data", c.dataDir,
                 "Directory with the Fashion-MNIST IDX files (or torchvision's FashionMNIST/raw "
                 "below it); the default is where Debian's dataset-fashion-mnist puts them");
  app.add_flag("--synthetic", c.synthetic, "Train on generated data instead");
  app.add_option("--device", c.device, "cpu, cuda or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}));
  app.add_option("--cpu-math", c.cpuMath,
                 "auto (the AVX2 and FMA build where the CPU has them) or baseline")
      ->check(CLI::IsMember({"auto", "baseline"}));
  app.add_option("--allreduce", c.allreduce,
                 "auto (shared memory when all ranks are on one machine, else Gloo over TCP) "
                 "or gloo")
      ->check(CLI::IsMember({"auto", "gloo"}));
  app.add_option("--checkpoint-dir", c.checkpointDir,
                 "Write checkpoints here and resume from the newest one at start");
  bool inMemory = false;
  app.add_flag("--checkpoint-in-memory", inMemory,
               "Write checkpoints to the node's memory that dlrun holds for the job as well "
               "(cheap enough for --checkpoint-every=1), and resume from the newest of both");
  app.add_option("--metrics-file", c.metricsFile,
                 "Append one JSON object per progress line and per epoch (step, epoch, loss, "
                 "accuracy, samples/s, lr, world size, restart) to this file (rank 0)");
  app.add_option("--checkpoint-every", c.checkpointEvery,
                 "Steps between checkpoints (0: at the end of each epoch only)")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--max-steps", c.maxSteps, "Stop after this many steps (-1: no limit)");
  app.add_option("--dump-weights", c.dumpWeights, "Write the final parameters (float32)");
  app.add_option("--progress-every", c.progressEvery, "Steps between progress lines")
      ->check(CLI::Range(1, 1 << 30));
  app.add_flag("--single", c.single, "Train alone, without dlrun");
  app.add_option("--strategy", c.strategy,
                 "allreduce (every rank sums the gradients with the others) or ps (parameter "
                 "servers: start with dlrun --roles ps:P,worker:W)")
      ->check(CLI::IsMember({"allreduce", "ps"}));
  app.add_flag("--ps-sync", c.psSync,
               "With --strategy ps: synchronous steps (the servers apply the mean of every "
               "worker's gradient), instead of applying each push as it comes");
  app.add_option("--fail-at-step", c.failAtStep,
                 "Testing aid: rank 1 (0 when alone) exits with code 1 after this global step "
                 "on the first attempt (TORCHELASTIC_RESTART_COUNT=0) only");
  app.add_option("--hang-at-step", c.hangAtStep,
                 "Testing aid: the last rank sleeps for ever at the start of this global step, "
                 "before its all-reduce, on the first attempt only");
  app.set_version_flag("--version", kVersion);
  result.exitCode = parseCommandLine(app, args, kVersion);
  if (result.exitCode) return result;
  c.cosine = schedule == "cosine";
  if (inMemory) {
    const char* memory = std::getenv("DLRUN_CHECKPOINT_SHM");
    if (memory == nullptr || *memory == '\0')
      throw ConfigError(
          "--checkpoint-in-memory needs the node memory dlrun holds for the job "
          "(DLRUN_CHECKPOINT_SHM is not set): run under dlrun, or use --checkpoint-dir");
    c.memoryCheckpointDir = std::string(memory) + "/train";
  }
  if (c.hidden.empty()) throw ConfigError("--hidden needs at least one width");
  if (c.model == "cnn") {
    if (app.count("--hidden"))
      throw ConfigError("--hidden sizes the MLP: drop it with --model cnn");
    // Its steps cost some 30 times the MLP's; 8 epochs reach 0.91 (the MLP's 15 reach 0.89).
    if (!app.count("--epochs")) c.epochs = 8;
  }
  if (c.psSync && c.strategy != "ps") throw ConfigError("--ps-sync needs --strategy ps");
  if (c.strategy == "ps") {
    if (c.single) throw ConfigError("--strategy ps needs dlrun's roles, not --single");
    if (c.device == "cuda")
      throw ConfigError("--strategy ps trains on the CPU: drop --device cuda");
    c.device = "cpu";
  }
  if (!c.single) result.placement = placementFromEnvironment();
  if (c.strategy == "ps") result.placement.ps = psPlaceFromTfConfig(std::getenv("TF_CONFIG"));
  return result;
}

}  // namespace dlrun::trainer
