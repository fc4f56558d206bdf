// A failed CUDA, cuBLAS or NCCL call becomes an Error naming the call and the library's reason.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <string>

#include "common/error.h"
#include "trainer/cublas_api.h"

namespace dlrun::trainer::cuda {

inline void check(cudaError_t status, const char* call) {
  if (status != cudaSuccess)
    throw Error(std::string(call) + " failed: " + cudaGetErrorString(status));
}

inline void check(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw Error(std::string(call) + " failed: " + cublasApi().statusString(status));
}

inline void check(ncclResult_t status, const char* call) {
  if (status != ncclSuccess) {
    // The last error says more than the code ("Duplicate GPU detected", a peer's address).
    const char* detail = ncclGetLastError(nullptr);
    throw Error(std::string(call) + " failed: " + ncclGetErrorString(status) +
                (detail != nullptr && *detail != '\0' ? std::string(": ") + detail : ""));
  }
}

}  // namespace dlrun::trainer::cuda
