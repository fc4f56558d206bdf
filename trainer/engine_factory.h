// Which engine --device picks, apart from engine.h so that the interface does not include the
// engines that implement it.
#pragma once

#include <memory>
#include <string>

#include "store/store.h"
#include "trainer/collective.h"
#include "trainer/config.h"
#include "trainer/engine.h"

namespace dlrun::trainer {

// The engine --device asks for: "cpu", "cuda", or "auto" (cuda when this build has CUDA and a
// device is usable, else cpu). `collective` sums host values over the ranks and must outlive
// the engine; `store` is the job's store (null when alone), through which NCCL is bootstrapped.
// Throws Error when cuda is asked for but this build or this machine cannot provide it, and
// when the ranks did not all choose the same engine.
std::unique_ptr<Engine> makeEngine(const std::string& device, const EngineOptions& options,
                                   const Placement& placement, Collective& collective,
                                   std::shared_ptr<Store> store);

}  // namespace dlrun::trainer
