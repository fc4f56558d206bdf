// What the workers' torch needs of the store, asked before they start: torch 2.4 and later ask
// for libuv in every TCPStore client of an agent's store, and a build without libuv (Debian
// 13's torch 2.6) refuses to make one, so its workers meet at a store rank 0 serves instead
// (serveStoreAtRankZero, worker_env.h). python/dlrun_torch_probe.py answers under the workers'
// interpreter and environment without importing torch; docs/design/agent.md, "A torch without
// libuv".
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace dlrun::agents {

struct TorchBuild {
  std::string version;        // torch.__version__; empty where unknown
  std::string path;           // the package's directory
  std::optional<bool> libuv;  // unset: no library of torch's was found to read

  // No libuv in a torch whose agent-store client asks for it (2.4 and later).
  bool refusesAgentStore() const;
};

// The probe's line (pure): nullopt for "{}" (no torch), an error or anything unreadable.
std::optional<TorchBuild> parseTorchProbe(std::string_view line);

// Runs the probe under `interpreter` with this process's environment. nullopt where it finds
// no torch, or fails, or runs past `limit` (then killed): the workers start as before.
std::optional<TorchBuild> probeTorch(const std::string& interpreter,
                                     std::chrono::milliseconds limit);

}  // namespace dlrun::agents
