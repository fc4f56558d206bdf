// Discovery under mpirun: `mpirun -np 3 -H a:1,b:1,c:1 -x MASTER_ADDR dlrun --nproc-per-node=4
// train` starts one dlrun per host, and each takes from Open MPI's (or PMIx's) variables what
// its flags leave open, as it does from Slurm's (slurm/discovery.h). Pure; the flags win.
//
//   OMPI_COMM_WORLD_RANK, else PMIX_RANK      the group-rank hint (ranks follow mpirun's order)
//   OMPI_COMM_WORLD_SIZE                      --nnodes (a fixed size); PMIx alone says no size
//   OMPI_MCA_ess_base_jobid, else PMIX_NAMESPACE
//                                             the rendezvous id ("mpi-" + it), and the port
//   MASTER_ADDR, MASTER_PORT                  the c10d store (mpirun -x MASTER_ADDR); the port
//                                             is derived from the job id when MASTER_PORT is unset
//   DLRUN_MPI=0                               turns the discovery off
#pragma once

#include "common/discovery.h"

namespace dlrun::mpi {

// The user flags as Slurm's (nprocAuto means nothing here); the port is derived from a hash of
// the job id, in Slurm's range (discovery::derivedPort).
using discovery::UserFlags;

// Whether dlrun runs under mpirun: OMPI_COMM_WORLD_RANK or PMIX_RANK is set, unless
// DLRUN_MPI=0. Throws ConfigError for a DLRUN_MPI other than 0 or 1.
bool detected(const Environment& env);

// What mpirun gives: the id, the endpoint (MASTER_ADDR), the rank hint and the size.
using discovery::Settings;

// Throws ConfigError naming the variable for a malformed value, for a job whose size no variable
// gives (PMIx alone) without --nnodes, and for a missing MASTER_ADDR without --rdzv-endpoint.
Settings discover(const Environment& env, const UserFlags& user);

}  // namespace dlrun::mpi
