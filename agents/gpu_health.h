// The GPU check before every round (health_check.h, docs/guides/health-checks.md): each GPU the
// job sees answers NVML, and, under --health-gpus=N, at least N of them are there. NVML is the
// driver's own library, opened at run time (dlopen, as slurm/libslurm.cpp opens libslurm), never
// linked: one dlrun runs on nodes with any driver or none, and a node without GPUs (no library,
// no driver, no GPU) skips the check unless the job said how many GPUs it expects.
//
// The thin part asks NVML (askNvml); the pure part (visibleIndices, gpuProblem) judges what it
// said, so that the judgement is tested without a library.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace dlrun::agents {

// NVML's return codes dlrun tells apart (nvml.h's nvmlReturn_t).
namespace nvml {
constexpr int kSuccess = 0;
constexpr int kNotSupported = 3;
constexpr int kNoPermission = 4;
constexpr int kDriverNotLoaded = 9;
constexpr int kLibraryNotFound = 12;
constexpr int kGpuIsLost = 15;
}  // namespace nvml

// One GPU asked: its NVML index, and NVML's answer to the memory query (or to the handle).
struct GpuAnswer {
  unsigned index = 0;
  bool listed = true;          // NVML lists it (a CUDA_VISIBLE_DEVICES index may name none)
  int error = nvml::kSuccess;  // NVML's return code
  std::string text;            // nvmlErrorString's, where error is not kSuccess
};

// What NVML said, in the order it was asked.
struct NvmlSaid {
  std::string unopened;  // why the library did not open (dlerror); empty: it opened
  int initError = nvml::kSuccess;
  std::string initText;
  int countError = nvml::kSuccess;
  std::string countText;
  unsigned count = 0;               // the GPUs NVML lists
  std::vector<GpuAnswer> gpus;      // those the job sees (visibleIndices), each asked
  bool fromVisibleDevices = false;  // they are CUDA_VISIBLE_DEVICES's
};

// The GPUs the job sees, as NVML indices (pure): those CUDA_VISIBLE_DEVICES lists where it lists
// only numbers (CUDA's order taken as NVML's, by PCI bus); nothing, for every GPU NVML lists, where
// it is unset, empty or names GPUs otherwise (UUIDs name GPUs NVML lists anyway).
std::optional<std::vector<unsigned>> visibleIndices(const std::optional<std::string>& cudaVisible);

// Why the node's GPUs are unfit, one line; nothing when they are fit or the node has none and
// `expected` (--health-gpus) is 0 (pure).
std::optional<std::string> gpuProblem(const NvmlSaid& said, int expected);

// Asks the NVML at `library` (a name or a path) about the GPUs the job sees, CUDA_VISIBLE_DEVICES
// read from `cudaVisible`. Opens the library once per process (never closed: its functions may
// be in use), and NVML anew each time (nvmlInit, nvmlShutdown), so a GPU lost since is seen.
NvmlSaid askNvml(const std::string& library, const std::optional<std::string>& cudaVisible);

// The check, as checkHealth runs it: askNvml with this process's CUDA_VISIBLE_DEVICES, judged.
// NVML that does not answer within `limit` (--health-check-timeout: a GPU or its driver hanging)
// is a problem itself, and so is every check while it still has not.
std::optional<std::string> checkGpus(const std::string& library, int expected,
                                     std::chrono::milliseconds limit = std::chrono::seconds(60));

}  // namespace dlrun::agents
