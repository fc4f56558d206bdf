// What the launcher's parser may ask of the machine it runs on: CPUs, GPUs, PATH, files, where
// dlrun lives, and the Slurm variables. Parsing reads the machine only through this, so tests
// hand it a fake one.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "agents/numa_binding.h"
#include "slurm/discovery.h"

namespace dlrun::launcher {

struct HostProbe {
  std::function<int()> cpuCount;
  std::function<int()> gpuCount;
  // Absolute path of a program name found on PATH, or nullopt.
  std::function<std::optional<std::string>(const std::string&)> findOnPath;
  // Whether a path names an existing file.
  std::function<bool(const std::string&)> fileExists;
  // A host name's numeric address, or nullopt where it does not resolve (--hostfile's hosts).
  std::function<std::optional<std::string>(const std::string&)> resolveHost;
  // --numa-binding: each local rank's CPUs on this machine (agents/numa_binding.h), read from
  // sysfs under DLRUN_SYSFS_ROOT (tests' fake machines), else /.
  std::function<std::vector<std::vector<int>>(agents::NumaMode, int nproc)> numaCpuSets;
  std::string selfDir;     // where dlrun lives: the bundled dlrun-train sits beside it
  std::string pythonExec;  // PYTHON_EXEC, else environmentPython(), else "python3"
  // The SLURM*, DLRUN_SLURM (Slurm discovery), OMPI_*, PMIX_*, DLRUN_MPI, MASTER_ADDR,
  // MASTER_PORT (mpirun discovery), DLRUN_ETCD_ENDPOINTS, DLRUN_TOKEN (the job's token, for
  // the launch and for `dlrun status|events|stop`), CUDA_VISIBLE_DEVICES (--virtual-local-rank),
  // TORCH_ELASTIC_SHUTDOWN_TIMEOUT (--stop-timeout's default), TORCHELASTIC_HEALTH_CHECK_PORT
  // (the liveness answer's port), TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE (the prefix's
  // default) and KUBERNETES_SERVICE_HOST (in a pod: stop_policy's default) variables.
  Environment env;
  // This machine: its CPU affinity, /dev/nvidia*, sysfs, PATH, /proc/self/exe and environment.
  static HostProbe real();
};

// The interpreter of the Python environment dlrun is installed in (a venv: `pyvenv.cfg` above
// its directory; a conda environment: `conda-meta/`), as torchrun runs a script with its own;
// empty elsewhere (a system or build-tree dlrun runs the `python3` on PATH, as before). Pure:
// `exists` answers for files and directories.
std::string environmentPython(const std::string& selfDir,
                              const std::function<bool(const std::string&)>& exists);

}  // namespace dlrun::launcher
