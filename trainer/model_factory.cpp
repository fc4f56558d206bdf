#include "trainer/model_factory.h"

#include "trainer/cnn_model.h"

namespace dlrun::trainer {

std::unique_ptr<Model> makeModel(const ModelSpec& spec, uint64_t seed, const MlpMath& math) {
  if (spec.kind == "cnn") return std::make_unique<Cnn>(spec.cnn, seed, math);
  return std::make_unique<Mlp>(spec.mlp, seed, math);
}

}  // namespace dlrun::trainer
