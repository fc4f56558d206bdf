// Which build of the CPU engine's math runs (mlp_math.h): the AVX2 and FMA module where the CPU
// has both, else the baseline built into the program.
#pragma once

#include <string>

#include "trainer/mlp_math.h"

namespace dlrun::trainer {

// The module's file name, looked for beside the program (a build directory) and then in the
// installed package's library directory, DLRUN_MODULE_DIR relative to the program's directory
// (both found from /proc/self/exe, so an installed tree works wherever it is put).
inline constexpr const char* kAvx2ModuleName = "dlrun-train-avx2.so";

// Whether this CPU, and the OS's saving of its registers, run AVX2 and FMA code.
bool cpuHasAvx2();

// The table of the module at `path`, which stays loaded. Call only where cpuHasAvx2(). Throws
// Error naming the path when it cannot be loaded or lacks the entry point.
const MlpMath& loadMathModule(const std::string& path);

// The CPU engine's math for --cpu-math `choice`: with "auto", the module where the CPU has AVX2 and
// FMA; else, or with "baseline", the baseline. Logs the choice at debug level, and a module that
// exists but does not load as a warning.
const MlpMath& cpuMath(const std::string& choice);

}  // namespace dlrun::trainer
