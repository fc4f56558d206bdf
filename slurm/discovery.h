// Slurm discovery: inside an allocation, what a multi-node dlrun needs comes from the SLURM_*
// variables of its job step, so `srun --ntasks-per-node=1 dlrun --nproc-per-node=4 train` needs
// no other flag. Pure: the variables come in as a map, the settings go out; the flags the user
// gave always win. The one lookup it leaves to the launcher is resolving the store's host.
//
//   SLURM_JOB_ID                         the rendezvous id, and the store's port (below)
//   SLURM_STEP_NODELIST, else SLURM_JOB_NODELIST
//                                        the nodes; the store is served on the first one
//   SLURM_NODEID                         the group-rank hint (ranks follow Slurm's node order)
//   SLURM_STEP_NUM_NODES, else SLURM_NNODES
//                                        --nnodes when it is not given (a fixed size)
//   SLURM_GPUS_ON_NODE, SLURM_NTASKS_PER_NODE, SLURM_CPUS_ON_NODE
//                                        --nproc-per-node=auto: the GPUs Slurm gave this node,
//                                        else its tasks per node when more than 1 (dlrun runs
//                                        them as workers), else its CPUs
//   SLURMD_NODENAME                      the node's name: several slurmd may share one host,
//                                        so the host name alone does not tell nodes apart
//   SLURM_STEP_ID                        unset in a batch script: a job of several nodes there
//                                        is refused (one dlrun would wait for the others)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/discovery.h"

namespace dlrun::slurm {

using discovery::UserFlags;

// Whether the launcher should read Slurm: inside an allocation (SLURM_JOB_ID is set) unless
// DLRUN_SLURM=0. Throws ConfigError for a DLRUN_SLURM other than 0 or 1.
bool detected(const Environment& env);

// The settings Slurm supplies; each is unset where the user's flag wins or Slurm says nothing.
struct Settings {
  std::optional<std::string> rdzvId;
  std::optional<std::string> endpointHost;  // the first node, by name: resolved once, later
  std::optional<uint16_t> endpointPort;
  std::optional<bool> servesStore;          // with the derived endpoint: this is the first node
                                            // (by SLURMD_NODENAME, else SLURM_NODEID 0)
  std::optional<int> nodeRank;
  std::optional<int> nnodes;
  std::optional<int> nprocPerNode;
  std::optional<std::string> nodeName;
  // The step's nodes by name, where the endpoint is derived (the first serves the store): the
  // hosts that store admits.
  std::vector<std::string> nodes;
};

// Throws ConfigError naming the variable for a malformed value, a missing node list where the
// endpoint must be derived, or a several-node job outside a job step.
Settings discover(const Environment& env, const UserFlags& user);

}  // namespace dlrun::slurm
