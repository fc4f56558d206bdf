// The CPU engine: the Eigen model and SGD on host buffers, gradients summed by a Collective
// (Gloo over TCP, or nothing when alone).
#pragma once

#include <memory>

#include "trainer/engine.h"

namespace dlrun::trainer {

// `collective` must outlive the engine.
std::unique_ptr<Engine> makeCpuEngine(const EngineOptions& options, Collective& collective);

}  // namespace dlrun::trainer
