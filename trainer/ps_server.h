// A parameter server (--strategy ps, ROLE_NAME ps): holds one contiguous shard of the model's
// parameters and its momentum, applies the workers' gradients with the trainer's SGD, and
// hands the fresh shard back (ps_wire.h). Asynchronous by default: each push is applied at
// once with the gradient scaled by 1/workers, so a round of pushes moves the model as one
// averaged step would; --ps-sync sums one push per worker in worker order and applies the mean
// once, as the all-reduce does. It publishes its address in the job's store and exits 0 once
// every worker said Done.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "store/store.h"
#include "trainer/config.h"
#include "trainer/ps_layout.h"

namespace dlrun::trainer {

// Serves until every worker is done; prints this process's summary line (rank 0 speaks for
// the job, each server for its own traffic). `connect` opens the job's store, namespaced per
// attempt, once the shard is known to hold parameters.
void servePs(const TrainConfig& config, const Placement& placement, const PsPlace& place,
             const std::function<std::shared_ptr<Store>()>& connect);

// The store key where server `index` publishes "ADDRESS PORT".
std::string psAddressKey(int index);

}  // namespace dlrun::trainer
