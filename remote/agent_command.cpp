#include "remote/agent_command.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string_view>

#include "common/error.h"

namespace dlrun::remote {
namespace {

// Forwarded by default: what finds programs and libraries, and the job's own settings.
constexpr std::array kNames{"PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "PYTHON_EXEC"};
// TORCH_ and TORCHELASTIC_: the job's torch settings, some read by the agents themselves
// (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, TORCHELASTIC_ENABLE_FILE_TIMER).
constexpr std::array kPrefixes{"CUDA_", "NCCL_", "PET_", "DLRUN_", "TORCH_", "TORCHELASTIC_"};
// Never forwarded, even with --export-all: they describe this machine, this session, or a
// launcher of another kind (Slurm, Open MPI), which the remote agent would take as its own.
constexpr std::array kLocalNames{"HOME",     "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD",  "SHLVL",
                                 "HOSTNAME", "TERM", "DISPLAY", "MAIL",  "_",   "COLUMNS", "LINES"};
constexpr std::array kLocalPrefixes{"SSH_", "XDG_", "SLURM", "OMPI_", "PMIX_", "TMUX", "DBUS_"};

bool hasPrefix(const std::string& name, const auto& prefixes) {
  return std::any_of(prefixes.begin(), prefixes.end(),
                     [&](std::string_view prefix) { return name.starts_with(prefix); });
}

bool isOneOf(const std::string& name, const auto& names) {
  return std::find(names.begin(), names.end(), std::string_view(name)) != names.end();
}

bool validName(std::string_view name) {
  return !name.empty() && !std::isdigit(static_cast<unsigned char>(name.front())) &&
         std::all_of(name.begin(), name.end(),
                     [](unsigned char c) { return std::isalnum(c) || c == '_'; });
}

// Flags the agents never get from the launcher's command line, by dashed name; all but those of
// kFlagsWithoutValue take a value (as --flag=VALUE or as the next word).
constexpr std::array kDropped{"hostfile",  "hosts",        "ssh-command",   "ssh-port",
                              "export",    "export-all",   "nnodes",        "nproc-per-node",
                              "node-rank", "rdzv-backend", "rdzv-endpoint", "rdzv-id",
                              "rdzv-conf", "standalone"};
constexpr std::array kFlagsWithoutValue{"export-all", "standalone"};

}  // namespace

Environment forwardedEnvironment(const Environment& env, const std::vector<std::string>& exports,
                                 bool exportAll) {
  Environment out;
  for (const auto& [name, value] : env) {
    const bool local = isOneOf(name, kLocalNames) || hasPrefix(name, kLocalPrefixes);
    if (isOneOf(name, kNames) || hasPrefix(name, kPrefixes) || (exportAll && !local))
      out[name] = value;
  }
  for (const auto& item : exports) {
    const size_t eq = item.find('=');
    const std::string name = item.substr(0, eq);
    if (!validName(name)) throw ConfigError("--export: '" + item + "' is not VAR or VAR=VALUE");
    if (eq != std::string::npos) {
      out[name] = item.substr(eq + 1);
    } else if (auto it = env.find(name); it != env.end()) {
      out[name] = it->second;
    } else {
      throw ConfigError("--export " + name + ": " + name + " is not set here");
    }
  }
  return out;
}

std::vector<std::string> keptFlags(const std::vector<std::string>& flags) {
  std::vector<std::string> kept;
  for (size_t i = 0; i < flags.size(); ++i) {
    const std::string& flag = flags[i];
    std::string name = flag.starts_with("--") ? flag.substr(2, flag.find('=') - 2) : "";
    std::replace(name.begin(), name.end(), '_', '-');
    if (!isOneOf(name, kDropped)) {
      kept.push_back(flag);
      continue;
    }
    // A valued flag written without '=' takes the next word with it.
    if (flag.find('=') == std::string::npos && !isOneOf(name, kFlagsWithoutValue)) ++i;
  }
  return kept;
}

std::string shellQuote(const std::string& text) {
  std::string quoted = "'";
  for (char c : text) {
    if (c == '\'')
      quoted += "'\\''";
    else
      quoted += c;
  }
  return quoted + "'";
}

std::string agentCommand(const RemoteJob& job, int nodeRank, std::optional<int> slots) {
  std::string command = "cd " + shellQuote(job.workDir) + " && exec env";
  for (const auto& [name, value] : job.env) command += " " + shellQuote(name + "=" + value);
  command += " " + shellQuote(job.dlrun);
  for (const auto& flag : job.flags) command += " " + shellQuote(flag);
  auto add = [&](const std::string& flag, const std::string& value) {
    if (!value.empty()) command += " " + shellQuote("--" + flag + "=" + value);
  };
  add("nnodes", std::to_string(job.nodes));
  add("node-rank", std::to_string(nodeRank));
  add("nproc-per-node", job.nproc.empty() ? std::to_string(slots.value_or(1)) : job.nproc);
  add("rdzv-backend", job.backend);
  add("rdzv-endpoint", job.endpoint);
  add("rdzv-id", job.rdzvId);
  add("rdzv-conf", job.rdzvConf);
  command += " --control-stdin --";
  for (const auto& word : job.entry) command += " " + shellQuote(word);
  return command;
}

std::vector<std::string> splitCommand(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  for (char c : text + " ") {
    if (!std::isspace(static_cast<unsigned char>(c))) {
      word += c;
    } else if (!word.empty()) {
      words.push_back(std::move(word));
      word.clear();
    }
  }
  if (words.empty()) throw ConfigError("--ssh-command: empty; give the ssh client to run");
  return words;
}

std::vector<std::string> sshArgv(const std::vector<std::string>& sshCommand,
                                 std::optional<uint16_t> port, const std::string& host,
                                 const std::string& remoteCommand) {
  std::vector<std::string> argv = sshCommand;
  argv.insert(argv.end(), {"-o", "BatchMode=yes"});
  if (port) argv.insert(argv.end(), {"-p", std::to_string(*port)});
  argv.insert(argv.end(), {host, remoteCommand});
  return argv;
}

}  // namespace dlrun::remote
