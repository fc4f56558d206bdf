// dlrun-train-avx2.so's entry point: the table of mlp_math.cpp as built for AVX2 and FMA. The
// module exports this symbol alone (mlp_math_module.map).
#include "trainer/mlp_math.h"

extern "C" __attribute__((visibility("default"))) const dlrun::trainer::MlpMath*
dlrun_train_math_v2() {
  return &dlrun::trainer::builtInMath();
}
