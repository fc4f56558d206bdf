// Slurm discovery: inside an allocation, what a multi-node dlrun needs comes from the SLURM_*
// variables of its job step, so `srun --ntasks-per-node=1 dlrun --nproc-per-node=4 train` needs
// no other flag. Pure: the variables come in as a map, the settings go out; the flags the user
// gave always win. The one lookup it leaves to the launcher is resolving the store's host.
//
//   SLURM_JOB_ID                         the rendezvous id, and the store's port (below)
//   SLURM_STEP_RESV_PORTS                srun --resv-ports: the store's port is the first of
//                                        the step's reserved ports (else one from the job id)
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
//   SLURM_RESTART_COUNT                  a requeued job: the log tree of the run before goes on
//   SLURM_STEP_ID                        unset in a batch script: a job of several nodes there
//                                        is refused (one dlrun would wait for the others)
#pragma once

#include "common/discovery.h"

namespace dlrun::slurm {

using discovery::UserFlags;
// Slurm can fill every field: the endpoint is the step's first node (servesStore: this node is it,
// by SLURMD_NODENAME, else SLURM_NODEID 0), nodes the step's nodes, refuseLostNodes always.
using discovery::Settings;

// Whether the launcher should read Slurm: inside an allocation (SLURM_JOB_ID is set) unless
// DLRUN_SLURM=0. Throws ConfigError for a DLRUN_SLURM other than 0 or 1.
bool detected(const Environment& env);

// Throws ConfigError naming the variable for a malformed value, a missing node list where the
// endpoint must be derived, or a several-node job outside a job step.
Settings discover(const Environment& env, const UserFlags& user);

}  // namespace dlrun::slurm
