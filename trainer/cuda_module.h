// The CUDA engine as a module: dlrun-train-cuda.so, linked against the CUDA runtime and NCCL,
// which dlrun-train itself is not, so one dlrun-train starts and trains on the CPU on any node
// and opens the module only for --device cuda or auto. The module is found as the AVX2 math
// module is (beside the program, then the installed package's library directory) and binds the
// program's own symbols (its Error, log and model code), which dlrun-train exports for it.
#pragma once

#include <memory>
#include <string>

#include "store/store.h"
#include "trainer/collective.h"
#include "trainer/config.h"
#include "trainer/engine.h"

namespace dlrun::trainer {

struct CudaDevices {
  int count = 0;
  std::string problem;  // why there is none, when count is 0
};

// The module's table. Bump kCudaModuleEntry when it changes, so a stale module is refused
// rather than called through another layout.
struct CudaModule {
  // The devices this process can use (CUDA_VISIBLE_DEVICES applies). Never throws.
  CudaDevices (*findDevices)();
  // The CUDA engine (cuda_engine.h).
  std::unique_ptr<Engine> (*makeEngine)(const EngineOptions& options, const Placement& placement,
                                        Collective& collective, std::shared_ptr<Store> store);
};

inline constexpr const char* kCudaModuleName = "dlrun-train-cuda.so";
inline constexpr const char* kCudaModuleEntry = "dlrun_train_cuda_v1";

// The module, or why it is not there: loaded once per process and kept.
struct CudaModuleLoad {
  const CudaModule* module = nullptr;
  std::string problem;  // one clause: what is missing, naming the file or library
};
const CudaModuleLoad& loadCudaModule();

// What dlopen's message says is missing: the first "NAME: cannot open shared object file" (a
// library the module needs, or the module itself), else the whole message. Pure, for tests.
std::string missingLibrary(const std::string& dlopenError);

}  // namespace dlrun::trainer
