// Runs a parsed launch: hosts the store when this node owns it, forms the world through the
// rendezvous, and hands the workers to the agent. Returns the process exit code.
#pragma once

#include "launcher/launch_config.h"

namespace dlrun::launcher {

int launch(const LaunchConfig& config);

// A fresh run id, a random UUID as torchrun's, for --standalone and a launch that names none.
std::string newRunId();

}  // namespace dlrun::launcher
