#include "trainer/cublas_api.h"

#include <dlfcn.h>

#include <string>

#include "common/error.h"

namespace dlrun::trainer::cuda {
namespace {

// The runtime's name (libcublas.so.13) through the loader's search path first, so a node whose
// cuBLAS lies elsewhere than on the build machine (LD_LIBRARY_PATH, ldconfig) finds its own;
// then DLRUN_CUBLAS_LIBRARY, the library CMake found at configure time.
void* open() {
  void* library = ::dlopen(DLRUN_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
  if (library != nullptr) return library;
  const std::string bySoname = ::dlerror();
  library = ::dlopen(DLRUN_CUBLAS_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) throw Error("cannot load cuBLAS: " + bySoname + "; " + ::dlerror());
  return library;
}

CublasApi load() {
  void* library = open();
  auto symbol = [&](const char* name) {
    void* found = ::dlsym(library, name);
    if (found == nullptr) throw Error(std::string("cuBLAS lacks ") + name);
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
