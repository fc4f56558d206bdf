// cuBLAS, opened when the CUDA engine starts rather than with the program: loading it takes
// about 0.2 s and 100 MB of private memory per process, which every CPU run would pay otherwise.
#pragma once

#include <cublas_v2.h>

namespace dlrun::trainer::cuda {

struct CublasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) setStream;
  decltype(&cublasSgemm_v2) sgemm;
  decltype(&cublasGetStatusString) statusString;
};

// Loads the library on first use (never unloaded); throws Error when it cannot.
const CublasApi& cublasApi();

}  // namespace dlrun::trainer::cuda
