#include "trainer/cuda_module.h"

#include <dlfcn.h>

#include "common/program_files.h"

namespace dlrun::trainer {

std::string missingLibrary(const std::string& dlopenError) {
  const size_t cannot = dlopenError.find(": cannot open shared object file");
  if (cannot == std::string::npos) return dlopenError;
  const size_t start = dlopenError.rfind(": ", cannot - 1);
  return dlopenError.substr(start == std::string::npos ? 0 : start + 2,
                            cannot - (start == std::string::npos ? 0 : start + 2));
}

namespace {

CudaModuleLoad load() {
  const std::string path = findProgramFile(kCudaModuleName, DLRUN_MODULE_DIR);
  if (path.empty())
    return {.problem = std::string("this dlrun-train has no CUDA engine (") + kCudaModuleName +
                       " is neither beside it nor in " + DLRUN_MODULE_DIR +
                       " from it: install the package dlrun-cuda)"};
  // RTLD_LOCAL: the module binds the program's symbols, never the other way round.
  void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const std::string error = ::dlerror();
    const std::string library = missingLibrary(error);
    if (library == error) return {.problem = "cannot load " + path + ": " + error};
    return {.problem = "the CUDA engine needs " + library +
                       ", which this machine lacks (install NVIDIA's CUDA runtime and NCCL)"};
  }
  using Entry = const CudaModule* (*)();
  auto entry = reinterpret_cast<Entry>(::dlsym(handle, kCudaModuleEntry));
  if (entry == nullptr) {
    ::dlclose(handle);
    return {.problem = path + " has no " + kCudaModuleEntry + " (from another dlrun version?)"};
  }
  return {.module = entry()};
}

}  // namespace

const CudaModuleLoad& loadCudaModule() {
  static const CudaModuleLoad loaded = load();
  return loaded;
}

}  // namespace dlrun::trainer
