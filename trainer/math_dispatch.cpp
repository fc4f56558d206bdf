#include "trainer/math_dispatch.h"

#include <dlfcn.h>

#include "common/error.h"
#include "common/log.h"
#include "common/program_files.h"

namespace dlrun::trainer {

bool cpuHasAvx2() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

const MlpMath& loadMathModule(const std::string& path) {
  // RTLD_LOCAL: none of the module's symbols can bind the program's references.
  void* module = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (module == nullptr) throw Error("cannot load " + path + ": " + ::dlerror());
  using Entry = const MlpMath* (*)();
  auto entry = reinterpret_cast<Entry>(::dlsym(module, kMathModuleEntry));
  if (entry == nullptr) {
    ::dlclose(module);
    throw Error(path + " has no " + kMathModuleEntry + " (built from other sources?)");
  }
  return *entry();
}

const MlpMath& cpuMath(const std::string& choice) {
  const MlpMath& baseline = builtInMath();
  if (choice == "baseline") {
    log::debug("CPU math: baseline (--cpu-math baseline)");
    return baseline;
  }
  if (!cpuHasAvx2()) {
    log::debug("CPU math: baseline (this CPU lacks AVX2 or FMA)");
    return baseline;
  }
  const std::string path = findProgramFile(kAvx2ModuleName, DLRUN_MODULE_DIR);
  if (path.empty()) {
    log::debug(std::string("CPU math: baseline (no ") + kAvx2ModuleName +
               " beside the program or in " + DLRUN_MODULE_DIR + " from it)");
    return baseline;
  }
  try {
    const MlpMath& avx2 = loadMathModule(path);
    log::debug("CPU math: " + std::string(avx2.isa) + " (" + path + ")");
    return avx2;
  } catch (const Error& e) {
    log::warn(std::string(e.what()) + "; using the baseline CPU math");
    return baseline;
  }
}

}  // namespace dlrun::trainer
