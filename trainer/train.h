// The training loop: data-parallel SGD over the sharded data, an all-reduce of the gradients
// each step, checkpoints, resumption, and a clean stop on SIGUSR1 or SIGTERM (a checkpoint at the
// next step boundary, then exit 0; SIGTERM before the first step ends the process at once).
#pragma once

#include "trainer/config.h"
#include "trainer/data.h"
#include "trainer/model.h"

namespace dlrun::trainer {

// The data --data (or --synthetic) names: every rank and parameter server loads the same.
Split loadData(const TrainConfig& config);

// The model --model names, sized for the data: --hidden for the MLP; the CNN takes 28x28
// images (Error otherwise).
ModelSpec modelSpec(const TrainConfig& config, const Dataset& data);

// Returns the process exit code.
int train(const TrainConfig& config, const Placement& placement);

}  // namespace dlrun::trainer
