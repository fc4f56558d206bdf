// The CPU engine: the Eigen model and SGD on host buffers (the AVX2 build of the math where the
// CPU has it, math_dispatch.h), gradients summed by a Collective (shared memory on one machine,
// Gloo over TCP across machines, or nothing when alone).
#pragma once

#include <memory>

#include "trainer/collective.h"
#include "trainer/engine.h"

namespace dlrun::trainer {

// `collective` must outlive the engine.
std::unique_ptr<Engine> makeCpuEngine(const EngineOptions& options, Collective& collective);

}  // namespace dlrun::trainer
