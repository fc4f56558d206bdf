// Which build of the CPU engine's math runs (mlp_math.h): the AVX2 and FMA module beside
// dlrun-train where the CPU has both, else the baseline built into the program.
#pragma once

#include <string>

#include "trainer/mlp_math.h"

namespace dlrun::trainer {

// The module's file name, looked for beside the program.
inline constexpr const char* kAvx2ModuleName = "dlrun-train-avx2.so";

// Whether this CPU, and the OS's saving of its registers, run AVX2 and FMA code.
bool cpuHasAvx2();

// The table of the module at `path`, which stays loaded. Call only where cpuHasAvx2(). Throws
// Error naming the path when it cannot be loaded or lacks the entry point.
const MlpMath& loadMathModule(const std::string& path);

// The CPU engine's math for --cpu-math `choice`: with "auto", the module beside the program
// where the CPU has AVX2 and FMA; else, or with "baseline", the baseline. Logs the choice at
// debug level, and a module that exists but does not load as a warning.
const MlpMath& cpuMath(const std::string& choice);

}  // namespace dlrun::trainer
