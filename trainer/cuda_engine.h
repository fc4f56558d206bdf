// The CUDA engine (built only with DLRUN_WITH_CUDA, into the module dlrun-train-cuda.so:
// cuda_module.h): parameters, gradients and momentum in device memory, cuBLAS SGEMMs for the
// layers, small kernels for the rest, and the gradients summed by NCCL, whose unique id travels
// through the job's store.
#pragma once

#include <memory>
#include <string>

#include "trainer/cuda_module.h"
#include "trainer/engine.h"

namespace dlrun::trainer {

// The devices this process can use (CUDA_VISIBLE_DEVICES applies). Never throws.
CudaDevices findCudaDevices();

// Runs on device LOCAL_RANK % devices. NCCL refuses two ranks on one device, so where a node has
// more ranks than devices, the gradients are summed through host memory by `collective` instead
// (all ranks agree on which). `collective` must outlive the engine. Throws Error naming the
// failed CUDA, cuBLAS or NCCL call.
std::unique_ptr<Engine> makeCudaEngine(const EngineOptions& options, const Placement& placement,
                                       Collective& collective, std::shared_ptr<Store> store);

}  // namespace dlrun::trainer
