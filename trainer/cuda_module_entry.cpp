// dlrun-train-cuda.so's entry point (cuda_module.h): the CUDA engine's table.
#include "trainer/cuda_engine.h"

extern "C" __attribute__((visibility("default"))) const dlrun::trainer::CudaModule*
dlrun_train_cuda_v1() {
  static constexpr dlrun::trainer::CudaModule table{dlrun::trainer::findCudaDevices,
                                                    dlrun::trainer::makeCudaEngine};
  return &table;
}
