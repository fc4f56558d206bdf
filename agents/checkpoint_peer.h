// dlrun.checkpoint's copies kept by another node's agent as well (docs/guides/checkpoints.md): a
// node lost takes its memory with it, and the steps its ranks completed stay whole on a peer.
//
// A worker asks its agent for it with rank-R/slot-K/replicate beside its copy ("STEP HOST:PORT",
// the peer agent: python/dlrun/checkpoint.py chooses the next node's); the courier
// (checkpoint_courier.h) sends the copy there (PUT, checkpoint_wire.h). Every agent of a job of
// several nodes serves, on a port of its own (its workers get HOST:PORT as DLRUN_CHECKPOINT_AGENT),
// the copies its peers send, kept in its memory as peer/rank-R/step-S/ (the same three files,
// the copy checked against its checksum before it is kept; a rank's 2 newest steps), and any copy
// it holds, its own workers' too, to a worker that asks (GET): a rank now placed on another node
// loads its step from there. Like the job's store, it trusts the network the job runs on.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "agents/checkpoint_files.h"

namespace dlrun::agents {

inline constexpr std::string_view kCheckpointAgentVariable = "DLRUN_CHECKPOINT_AGENT";

class CheckpointPeerServer {
 public:
  // Serves `memory` on `host` (a numeric address or a name, as the other nodes reach this one),
  // any free port, on a thread of its own: its copies are written and read at memory speed, a
  // second for a GB, off the agent's loop. Throws NetworkError when it cannot listen.
  CheckpointPeerServer(std::filesystem::path memory, const std::string& host);
  ~CheckpointPeerServer();  // stops what is under way, and joins
  CheckpointPeerServer(const CheckpointPeerServer&) = delete;
  CheckpointPeerServer& operator=(const CheckpointPeerServer&) = delete;

  // "HOST:PORT", where the other nodes reach it.
  std::string address() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A connection that stays silent this long is dropped (a peer gone mid-copy).
inline constexpr std::chrono::seconds kPeerIdleLimit{30};

// The copies the workers asked to be sent (their `replicate` files) sent, one PUT each; blocks.
CopyReport sendRequested(const std::filesystem::path& memory);

}  // namespace dlrun::agents
