// What a one-command launch runs on each host: the ssh command line and, inside it, the shell
// command that starts that host's dlrun agent in this directory with the job's environment and
// this dlrun's flags. Pure, so every rule is a unit test; the fan-out (fanout.h) runs the result.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/environment.h"

namespace dlrun::remote {

// The variables the agents get from the launcher's environment: PATH, PYTHONPATH,
// LD_LIBRARY_PATH, PYTHON_EXEC (the workers' Python), CUDA_*, NCCL_*, PET_*, DLRUN_* (dlrun's
// own), TORCH_*, TORCHELASTIC_*, each of `exports` (VAR, or
// VAR=VALUE to set it), and with `exportAll` everything but what belongs to this machine or
// session (HOME, USER, SHELL, PWD, HOSTNAME, TERM, SSH_*, XDG_*, SLURM_*, OMPI_*, PMIX_*, ...).
// Throws ConfigError for an exported VAR that is not set or is not a variable name.
Environment forwardedEnvironment(const Environment& env, const std::vector<std::string>& exports,
                                 bool exportAll);

// The launcher's own flags (the ones before the entry point) less those that make sense only to
// the launcher (--hostfile, --hosts, --ssh-command, --ssh-port, --export, --export-all) and those
// it sets for every agent itself (--nnodes, --nproc-per-node, --node-rank, --rdzv-backend,
// --rdzv-endpoint, --rdzv-id, --rdzv-conf, --standalone), in either spelling, with their values.
std::vector<std::string> keptFlags(const std::vector<std::string>& flags);

// One job's agents, all alike but for their node rank and slots.
struct RemoteJob {
  std::string dlrun;    // this dlrun's absolute path: the same on every host (a shared file system)
  std::string workDir;  // the launcher's working directory
  Environment env;      // forwardedEnvironment()
  std::vector<std::string> flags;  // keptFlags()
  int nodes = 1;
  std::string nproc;    // --nproc-per-node as given (evaluated on each host); empty: the slots
  std::string backend;  // --rdzv-backend, --rdzv-endpoint, --rdzv-id, --rdzv-conf; empty: unsaid
  std::string endpoint;
  std::string rdzvId;
  std::string rdzvConf;
  std::vector<std::string> entry;  // the entry point and its arguments
};

// The shell command (for the remote login shell) that runs node `nodeRank`'s agent:
// `cd DIR && exec env K=V... DLRUN FLAGS... --control-stdin -- ENTRY ARGS...`, every word quoted.
// A host without slots runs one worker unless --nproc-per-node says otherwise.
std::string agentCommand(const RemoteJob& job, int nodeRank, std::optional<int> slots);

// `text` quoted for a POSIX shell ('...', with ' written '\'').
std::string shellQuote(const std::string& text);

// --ssh-command split into words at white space ("ssh -i key" -> ssh, -i, key); throws
// ConfigError when there is no word.
std::vector<std::string> splitCommand(const std::string& text);

// The ssh client's argv: the command's words, `-o BatchMode=yes` (never a password prompt),
// `-p PORT` when given, the host, then the remote command as one argument.
std::vector<std::string> sshArgv(const std::vector<std::string>& sshCommand,
                                 std::optional<uint16_t> port, const std::string& host,
                                 const std::string& remoteCommand);

}  // namespace dlrun::remote
