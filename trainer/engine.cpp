#include "trainer/engine.h"

#include "common/error.h"
#include "trainer/cpu_engine.h"
#ifdef DLRUN_WITH_CUDA
#include "trainer/cuda_engine.h"
#endif

namespace dlrun::trainer {
namespace {

// Whether --device picks the CUDA engine on this rank.
bool wantsCuda(const std::string& device) {
  if (device == "cpu") return false;
#ifdef DLRUN_WITH_CUDA
  const CudaDevices found = findCudaDevices();
  if (device == "auto") return found.count > 0;
  if (found.count == 0)
    throw ConfigError("--device cuda: no usable CUDA device (" + found.problem +
                      "); use --device cpu");
  return true;
#else
  if (device == "auto") return false;
  throw ConfigError("--device cuda: this dlrun-train was built without CUDA; use --device cpu");
#endif
}

}  // namespace

std::unique_ptr<Engine> makeEngine(const std::string& device, const EngineOptions& options,
                                   const Placement& placement, Collective& collective,
                                   std::shared_ptr<Store> store) {
  const bool cuda = wantsCuda(device);
  // Ranks on different engines would not pair their sums: all must choose the same.
  float onCuda = cuda ? 1.0f : 0.0f;
  collective.allreduceSum(&onCuda, 1);
  if (onCuda != 0.0f && onCuda != static_cast<float>(collective.size()))
    throw Error("--device " + device + " chose cuda on some ranks only: pass --device cpu, or "
                "make a CUDA device usable on every node");
#ifdef DLRUN_WITH_CUDA
  if (cuda) return makeCudaEngine(options, placement, collective, std::move(store));
#endif
  return makeCpuEngine(options, collective);
}

}  // namespace dlrun::trainer
