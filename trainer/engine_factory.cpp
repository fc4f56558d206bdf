#include "trainer/engine_factory.h"

#include "common/error.h"
#include "common/log.h"
#include "trainer/cpu_engine.h"
#include "trainer/cuda_module.h"

namespace dlrun::trainer {
namespace {

// The CUDA module where --device picks it on this rank, else null. `say`: this rank tells
// which engine --device auto chose, in one line.
const CudaModule* chooseCuda(const std::string& device, const ModelSpec& model, bool say) {
  if (device == "cpu") return nullptr;
  // CUDA cannot run here, for `reason`: an error for --device cuda, the CPU for auto.
  const auto cpu = [&](const std::string& reason) -> const CudaModule* {
    if (device == "cuda") throw ConfigError("--device cuda: " + reason + "; use --device cpu");
    if (say) log::info("--device auto: cpu, as " + reason);
    return nullptr;
  };
  const CudaModuleLoad& loaded = loadCudaModule();
  if (loaded.module == nullptr) return cpu(loaded.problem);
  const CudaDevices found = loaded.module->findDevices();
  if (found.count == 0) return cpu("there is no usable CUDA device (" + found.problem + ")");
  // The CUDA engine's layers are the MLP's so far.
  if (model.kind != "mlp") return cpu("the CUDA engine trains --model mlp only");
  if (say && device == "auto")
    log::info("--device auto: cuda (" + std::to_string(found.count) + " device(s))");
  return loaded.module;
}

}  // namespace

std::unique_ptr<Engine> makeEngine(const std::string& device, const EngineOptions& options,
                                   const Placement& placement, Collective& collective,
                                   std::shared_ptr<Store> store) {
  const CudaModule* cuda = chooseCuda(device, options.model, collective.rank() == 0);
  // Ranks on different engines would not pair their sums: all must choose the same.
  float onCuda = cuda ? 1.0f : 0.0f;
  collective.allreduceSum(&onCuda, 1);
  if (onCuda != 0.0f && onCuda != static_cast<float>(collective.size()))
    throw Error("--device " + device +
                " chose cuda on some ranks only: pass --device cpu, or "
                "make a CUDA device usable on every node");
  if (cuda) return cuda->makeEngine(options, placement, collective, std::move(store));
  return makeCpuEngine(options, collective);
}

}  // namespace dlrun::trainer
