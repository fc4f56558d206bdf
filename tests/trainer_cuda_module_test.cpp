// The CUDA module's loader (cuda_module.h): what a failed dlopen is reduced to, and that a
// build without the module says so in one clause naming the package. The real thing, a CUDA
// build's package on a machine without CUDA, is tests/python/test_package_chroot.py.
#include "trainer/cuda_module.h"

#include <gtest/gtest.h>

namespace dlrun::trainer {
namespace {

TEST(CudaModuleTest, AMissingRuntimeIsNamed) {
  EXPECT_EQ(missingLibrary("/usr/lib/dlrun/dlrun-train-cuda.so: libcudart.so.13: cannot open "
                           "shared object file: No such file or directory"),
            "libcudart.so.13");
  EXPECT_EQ(missingLibrary("libnccl.so.2: cannot open shared object file: No such file or "
                           "directory"),
            "libnccl.so.2");
}

TEST(CudaModuleTest, AnotherLoaderErrorIsKeptWhole) {
  const std::string error = "/x/dlrun-train-cuda.so: undefined symbol: _ZN5dlrun3fooEv";
  EXPECT_EQ(missingLibrary(error), error);
}

TEST(CudaModuleTest, LoadingIsDecidedOnceAndExplained) {
  const CudaModuleLoad& first = loadCudaModule();
  EXPECT_EQ(&first, &loadCudaModule());
  // Either the module loaded, or the one clause says why (the package, or the library).
  if (first.module == nullptr) {
    EXPECT_NE(first.problem, "");
    EXPECT_EQ(first.problem.find('\n'), std::string::npos);
  } else {
    EXPECT_NE(first.module->findDevices, nullptr);
    EXPECT_NE(first.module->makeEngine, nullptr);
  }
}

}  // namespace
}  // namespace dlrun::trainer
