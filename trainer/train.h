// The training loop: data-parallel SGD over the sharded data, an all-reduce of the gradients
// each step, checkpoints, resumption, and a clean stop on SIGUSR1 or SIGTERM (a checkpoint at the
// next step boundary, then exit 0; SIGTERM before the first step ends the process at once).
#pragma once

#include "trainer/config.h"

namespace dlrun::trainer {

// Returns the process exit code.
int train(const TrainConfig& config, const Placement& placement);

}  // namespace dlrun::trainer
