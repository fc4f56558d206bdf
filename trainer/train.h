// The training loop: data-parallel SGD over the sharded data, an all-reduce of the gradients
// each step, checkpoints, resumption, and a clean stop on SIGUSR1 or SIGTERM.
#pragma once

#include "trainer/config.h"

namespace dlrun::trainer {

// Returns the process exit code.
int train(const TrainConfig& config, const Placement& placement);

}  // namespace dlrun::trainer
