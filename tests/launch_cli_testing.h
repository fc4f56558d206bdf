// Helpers shared by the dlrun command line's tests (launch_cli_test.cpp, launch_cli_rdzv_test.cpp,
// launch_cli_cluster_test.cpp): parseDlrunArgs end to end with a fake HostProbe (no real CPUs,
// GPUs, PATH or files are consulted), the ConfigError a call throws, and an environment variable
// set for one scope.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/error.h"
#include "launcher/launch_cli.h"

namespace dlrun::launcher {

using Args = std::vector<std::string>;

// The ConfigError message `fn` throws; fails the test when it throws nothing.
template <typename Fn>
std::string configError(Fn&& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError thrown";
  return {};
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A machine with 8 CPUs, `gpus` GPUs, a PATH holding `env` and `torchrun`, and a few files.
inline HostProbe fakeHost(int gpus = 0, bool trainerBuilt = false) {
  HostProbe host;
  host.cpuCount = [] { return 8; };
  host.gpuCount = [gpus] { return gpus; };
  host.findOnPath = [](const std::string& name) -> std::optional<std::string> {
    static const std::map<std::string, std::string> path = {
        {"env", "/usr/bin/env"}, {"torchrun", "/usr/local/bin/torchrun"}};
    auto it = path.find(name);
    if (it == path.end()) return std::nullopt;
    return it->second;
  };
  std::set<std::string> files = {"script.py", "/jobs/train.py", "/jobs/tool"};
  if (trainerBuilt) files.insert("/opt/dlrun/bin/dlrun-train");
  host.fileExists = [files](const std::string& p) { return files.contains(p); };
  // Every host resolves but those under .invalid (RFC 6761), to one address of the test net.
  host.resolveHost = [](const std::string& name) -> std::optional<std::string> {
    if (name.ends_with(".invalid")) return std::nullopt;
    return "192.0.2.1";
  };
  // --numa-binding: local rank i on CPU 10 * mode + i, so a test sees the mode and the count.
  host.numaCpuSets = [](agents::NumaMode mode, int nproc) {
    std::vector<std::vector<int>> sets;
    for (int i = 0; i < nproc; ++i) sets.push_back({10 * static_cast<int>(mode) + i});
    return sets;
  };
  host.selfDir = "/opt/dlrun/bin";
  host.pythonExec = "/fake/python3";
  return host;
}

inline LaunchConfig parse(const Args& args, const HostProbe& host = fakeHost()) {
  auto parsed = parseDlrunArgs(args, host);
  EXPECT_FALSE(parsed.exitCode);
  return parsed.config;
}

// Sets an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

}  // namespace dlrun::launcher
