#include "trainer/job_data.h"

#include <string>

#include "common/error.h"

namespace dlrun::trainer {

Split loadData(const TrainConfig& config) {
  return config.synthetic ? syntheticData(20000, 4000, 784, config.seed)
                          : loadFashionMnist(fashionMnistDir(config.dataDir));
}

ModelSpec modelSpec(const TrainConfig& config, const Dataset& data) {
  ModelSpec spec{.kind = config.model, .mlp = {data.features, config.hidden, data.classes}};
  spec.cnn.classes = data.classes;
  if (spec.kind == "cnn" && data.features != kCnnInputs)
    throw Error("--model cnn takes 28x28 images; this data has " + std::to_string(data.features) +
                " values per example");
  return spec;
}

}  // namespace dlrun::trainer
