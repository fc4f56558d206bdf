// Whether this node is fit to join the next round (docs/guides/health-checks.md): checked before
// every round, a node that fails sits the round out (a spare takes its place, or the round forms
// without it within --nnodes=MIN:MAX) and is checked again until it passes.
//
// The checks: free space where the logs and checkpoints go, free memory (both cheap, each
// against --health-min-free), the GPUs (gpu_health.h: each answers NVML, at least --health-gpus
// of them; skipped on a node without GPUs), then the user's command (--health-check=CMD, run by
// /bin/sh in a process group of its own: exit 0 is healthy, otherwise its last line says why),
// bounded by --health-check-timeout: one that hangs is killed with all it started, and fails.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace dlrun::agents {

struct HealthOptions {
  std::optional<std::string> command;  // --health-check
  std::chrono::milliseconds timeout{60'000};
  uint64_t minFreeBytes = 1ull << 30;       // disk and memory; 0: not checked
  std::vector<std::filesystem::path> dirs;  // where the free space is looked at
  std::filesystem::path meminfo = "/proc/meminfo";
  int gpus = 0;                            // --health-gpus: at least so many; 0: not counted
  std::string nvml = "libnvidia-ml.so.1";  // where NVML is opened from (a test's fake)
  // No other node can take this one's place (--nnodes=1, --standalone): a failed check ends
  // the launch instead of sitting out.
  bool alone = false;
  std::chrono::milliseconds recheck{5'000};  // a node sitting out is checked again so often
  // A node whose checks keep failing this long ends (the rendezvous's join_timeout), rather
  // than wait for ever where no round can form without it.
  std::chrono::milliseconds giveUp{600'000};
};

// Why the node is unfit, one line; nothing when it is fit.
using HealthProblem = std::optional<std::string>;

// What the user's check said, from its output (pure): its exit status as the wrapper printed
// it last on stdout, and the reason, the last non-empty line of its stderr, else of its stdout.
struct CheckOutput {
  std::optional<int> exitCode;  // none: it did not finish (killed)
  std::string reason;
};
CheckOutput readCheckOutput(const std::string& out, const std::string& err);

// "only 0.4 GiB free in DIR, under --health-min-free's 1 GiB" (pure).
HealthProblem spaceProblem(const std::string& where, uint64_t freeBytes, uint64_t minFreeBytes);
// MemAvailable of a /proc/meminfo text, in bytes (pure); nothing where it does not say.
std::optional<uint64_t> availableMemory(const std::string& meminfo);

// Every check, in order, the first problem found; blocks up to the command's timeout.
HealthProblem checkHealth(const HealthOptions& options);

}  // namespace dlrun::agents
