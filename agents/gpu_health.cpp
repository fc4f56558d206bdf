#include "agents/gpu_health.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>

#include "common/text.h"

namespace dlrun::agents {
namespace {

// NVML's C API (nvml.h), declared here so that nothing of the driver is needed to build dlrun:
// these have kept their signatures since the _v2 names came (driver 325). nvmlReturn_t is an
// enum, passed as an int.
struct NvmlDevice;
struct NvmlMemory {  // nvmlMemory_t (v1)
  unsigned long long total, free, used;
};
using Init = int (*)();
using Shutdown = int (*)();
using GetCount = int (*)(unsigned*);
using GetHandle = int (*)(unsigned, NvmlDevice**);
using GetMemory = int (*)(NvmlDevice*, NvmlMemory*);
using ErrorString = const char* (*)(int);

struct Library {
  Init init = nullptr;
  Shutdown shutdown = nullptr;
  GetCount count = nullptr;
  GetHandle handle = nullptr;
  GetMemory memory = nullptr;
  ErrorString errorString = nullptr;

  // False, with why, where the library does not open or lacks one of the functions.
  bool open(const std::string& name, std::string& why) {
    void* h = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char* error = ::dlerror();
      why = error ? error : name + ": cannot open";
      return false;
    }
    init = resolve<Init>(h, "nvmlInit_v2", why);
    shutdown = resolve<Shutdown>(h, "nvmlShutdown", why);
    count = resolve<GetCount>(h, "nvmlDeviceGetCount_v2", why);
    handle = resolve<GetHandle>(h, "nvmlDeviceGetHandleByIndex_v2", why);
    memory = resolve<GetMemory>(h, "nvmlDeviceGetMemoryInfo", why);
    errorString = resolve<ErrorString>(h, "nvmlErrorString", why);
    if (!why.empty()) {
      why = name + " " + why;
      ::dlclose(h);
      return false;
    }
    return true;
  }

  template <typename Fn>
  static Fn resolve(void* h, const char* symbol, std::string& why) {
    auto fn = reinterpret_cast<Fn>(::dlsym(h, symbol));
    if (!fn && why.empty()) why = std::string("has no ") + symbol;
    return fn;
  }

  std::string text(int error) const {
    const char* said = errorString(error);
    return said && *said ? said : "NVML error " + std::to_string(error);
  }
};

// Opened once per name (a test's fake is another) and kept: a library is never closed once its
// functions are used. One that does not open is tried again next time (a driver installed since).
const Library* library(const std::string& name, std::string& why) {
  static std::mutex mutex;
  static std::map<std::string, Library> opened;
  std::lock_guard lock(mutex);
  if (const auto it = opened.find(name); it != opened.end()) return &it->second;
  Library lib;
  if (!lib.open(name, why)) return nullptr;
  return &opened.emplace(name, lib).first->second;
}

GpuAnswer ask(const Library& lib, unsigned index) {
  GpuAnswer answer{.index = index};
  NvmlDevice* device = nullptr;
  answer.error = lib.handle(index, &device);
  if (answer.error == nvml::kSuccess) {
    NvmlMemory memory{};
    answer.error = lib.memory(device, &memory);
  }
  if (answer.error != nvml::kSuccess) answer.text = lib.text(answer.error);
  return answer;
}

std::string_view trimmed(std::string_view text) {
  const size_t first = text.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

std::string gpus(size_t n) { return std::to_string(n) + (n == 1 ? " GPU" : " GPUs"); }

}  // namespace

std::optional<std::vector<unsigned>> visibleIndices(const std::optional<std::string>& cudaVisible) {
  if (!cudaVisible || cudaVisible->find_first_not_of(" \t") == std::string::npos)
    return std::nullopt;
  std::vector<unsigned> indices;
  for (const std::string& entry : split(*cudaVisible, ',')) {
    const auto index = parseInteger<unsigned>(trimmed(entry));
    if (!index) return std::nullopt;  // a UUID, MIG-...: not an index
    indices.push_back(*index);
  }
  return indices;
}

std::optional<std::string> gpuProblem(const NvmlSaid& said, int expected) {
  const std::string flag = "--health-gpus=" + std::to_string(expected);
  if (!said.unopened.empty()) {
    if (expected <= 0) return std::nullopt;  // a node without GPUs
    return flag + ", but NVML does not open here to count them: " + said.unopened;
  }
  if (said.initError == nvml::kDriverNotLoaded || said.initError == nvml::kLibraryNotFound) {
    if (expected <= 0) return std::nullopt;
    return flag + ", but this node has no GPU driver (NVML: " + said.initText + ")";
  }
  if (said.initError != nvml::kSuccess) return "NVML does not start: " + said.initText;
  if (said.countError != nvml::kSuccess) return "NVML cannot count the GPUs: " + said.countText;
  if (said.count == 0) {
    if (expected <= 0) return std::nullopt;
    return flag + ", but NVML lists no GPU on this node";
  }
  std::string lost;
  size_t answering = 0;
  for (const GpuAnswer& gpu : said.gpus) {
    if (!gpu.listed)
      return "CUDA_VISIBLE_DEVICES names GPU " + std::to_string(gpu.index) + ", but NVML lists " +
             gpus(said.count) + " on this node (0-" + std::to_string(said.count - 1) + ")";
    // Not supported: the GPU answered all the same. No permission: not this job's GPU (a cgroup
    // hides it), neither lost nor counted.
    if (gpu.error == nvml::kSuccess || gpu.error == nvml::kNotSupported)
      ++answering;
    else if (gpu.error != nvml::kNoPermission)
      lost += (lost.empty() ? "" : "; ") + ("GPU " + std::to_string(gpu.index)) +
              " does not answer: " + gpu.text;
  }
  if (!lost.empty()) return lost;
  if (answering >= static_cast<size_t>(std::max(expected, 0))) return std::nullopt;
  return "only " + gpus(answering) +
         (said.fromVisibleDevices ? " in CUDA_VISIBLE_DEVICES" : " on this node") +
         ", under --health-gpus's " + std::to_string(expected);
}

namespace {
std::string stuckLine(std::chrono::milliseconds limit) {
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%g", static_cast<double>(limit.count()) / 1000);
  return std::string("NVML did not answer within ") + seconds + " s (a GPU or its driver hangs)";
}
}  // namespace

NvmlSaid askNvml(const std::string& name, const std::optional<std::string>& cudaVisible) {
  NvmlSaid said;
  const Library* lib = library(name, said.unopened);
  if (!lib) return said;
  said.initError = lib->init();
  if (said.initError != nvml::kSuccess) {
    said.initText = lib->text(said.initError);
    return said;
  }
  said.countError = lib->count(&said.count);
  if (said.countError != nvml::kSuccess) {
    said.countText = lib->text(said.countError);
  } else if (said.count > 0) {
    const auto visible = visibleIndices(cudaVisible);
    said.fromVisibleDevices = visible.has_value();
    std::vector<unsigned> indices;
    if (visible) indices = *visible;
    for (unsigned i = 0; !visible && i < said.count; ++i) indices.push_back(i);
    for (const unsigned index : indices)
      said.gpus.push_back(index < said.count ? ask(*lib, index)
                                             : GpuAnswer{.index = index, .listed = false});
  }
  lib->shutdown();
  return said;
}

std::optional<std::string> checkGpus(const std::string& library, int expected,
                                     std::chrono::milliseconds limit) {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::optional<std::string> cudaVisible =
      visible ? std::optional<std::string>(visible) : std::nullopt;
  // NVML asks the driver, and a GPU that hangs can hang it: the asking runs on a thread of its
  // own that is left behind when it overruns (it can be neither interrupted nor killed), and
  // while one is left behind no other is started, so a stuck driver costs one thread, not one a
  // round.
  static std::mutex mutex;
  static bool asking = false;  // a thread still waits on NVML
  std::future<NvmlSaid> answer;
  {
    std::lock_guard lock(mutex);
    if (asking) return stuckLine(limit);
    std::promise<NvmlSaid> promise;
    answer = promise.get_future();
    asking = true;
    std::thread([promise = std::move(promise), library, cudaVisible]() mutable {
      NvmlSaid said = askNvml(library, cudaVisible);
      std::lock_guard lock(mutex);
      promise.set_value(std::move(said));
      asking = false;
    }).detach();
  }
  if (answer.wait_for(limit) != std::future_status::ready) return stuckLine(limit);
  return gpuProblem(answer.get(), expected);
}

}  // namespace dlrun::agents
