// The dlrun command line: torchrun's flags (dashes or underscores, PET_<NAME> environment
// defaults, the flag winning) into one LaunchConfig. The small parsers are exposed so tests
// reach each rule directly; every error is a ConfigError naming the flag.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "launcher/launch_config.h"
#include "slurm/discovery.h"

namespace dlrun::launcher {

// What the parser may ask of the machine; tests pass their own.
struct HostProbe {
  std::function<int()> cpuCount;
  std::function<int()> gpuCount;
  // Absolute path of a program name found on PATH, or nullopt.
  std::function<std::optional<std::string>(const std::string&)> findOnPath;
  // Whether a path names an existing file.
  std::function<bool(const std::string&)> fileExists;
  std::string selfDir;        // where dlrun lives: the bundled dlrun-train sits beside it
  std::string pythonExec;     // PYTHON_EXEC, or "python3"
  slurm::Environment env;     // the SLURM*, and DLRUN_SLURM, variables (Slurm discovery)
  static HostProbe real();
};

struct LaunchParse {
  LaunchConfig config;
  std::optional<int> exitCode;  // set for --help/--version
};

LaunchParse parseDlrunArgs(const std::vector<std::string>& args, const HostProbe& host);

// "N" or "MIN:MAX".
std::pair<int, int> parseNnodes(const std::string& value);
// "N", "cpu", "gpu" or "auto".
int parseNprocPerNode(const std::string& value, const HostProbe& host);
// "3" or "0:1,1:2".
agents::StreamsByRank parseStreams(const std::string& flag, const std::string& value);
// "k=v,k2=v2".
std::map<std::string, std::string> parseRdzvConf(const std::string& value);
// The rendezvous settings in --rdzv-conf; unknown keys are refused.
RdzvSettings parseRdzvSettings(const std::map<std::string, std::string>& conf);
// "HOST", "HOST:PORT" or "[V6]:PORT"; the port is checked.
std::pair<std::string, std::optional<uint16_t>> parseEndpoint(const std::string& flag,
                                                              const std::string& value);
// "0,2,3".
std::set<int> parseRanksFilter(const std::string& value);

}  // namespace dlrun::launcher
