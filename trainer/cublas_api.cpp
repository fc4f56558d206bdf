#include "trainer/cublas_api.h"

#include <dlfcn.h>

#include <string>

#include "common/error.h"

namespace dlrun::trainer::cuda {
namespace {

CublasApi load() {
  // DLRUN_CUBLAS_LIBRARY: the library CMake found at configure time.
  void* library = ::dlopen(DLRUN_CUBLAS_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) throw Error(std::string("cannot load cuBLAS: ") + ::dlerror());
  auto symbol = [&](const char* name) {
    void* found = ::dlsym(library, name);
    if (found == nullptr)
      throw Error(std::string("cuBLAS at ") + DLRUN_CUBLAS_LIBRARY + " lacks " + name);
    return found;
  };
  return {reinterpret_cast<decltype(&cublasCreate_v2)>(symbol("cublasCreate_v2")),
          reinterpret_cast<decltype(&cublasDestroy_v2)>(symbol("cublasDestroy_v2")),
          reinterpret_cast<decltype(&cublasSetStream_v2)>(symbol("cublasSetStream_v2")),
          reinterpret_cast<decltype(&cublasSgemm_v2)>(symbol("cublasSgemm_v2")),
          reinterpret_cast<decltype(&cublasGetStatusString)>(symbol("cublasGetStatusString"))};
}

}  // namespace

const CublasApi& cublasApi() {
  static const CublasApi api = load();
  return api;
}

}  // namespace dlrun::trainer::cuda
