// Which model --model picks, apart from model.h so that the base class does not include the
// models that derive from it.
#pragma once

#include <cstdint>
#include <memory>

#include "trainer/mlp_math.h"
#include "trainer/model.h"

namespace dlrun::trainer {

// The model `spec` names, initialised from `seed` the same way on every rank.
std::unique_ptr<Model> makeModel(const ModelSpec& spec, uint64_t seed,
                                 const MlpMath& math = builtInMath());

}  // namespace dlrun::trainer
