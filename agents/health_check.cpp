#include "agents/health_check.h"

#include <sys/statvfs.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>

#include "agents/gpu_health.h"
#include "agents/tool_run.h"
#include "common/error.h"
#include "common/text.h"

namespace dlrun::agents {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kExitMark = "dlrun-health-check-exit ";
// The check's own deadline is `timeout`'s; this one is for the wrapper should that fail.
constexpr std::chrono::milliseconds kWrapperGrace{2'000};

std::string gib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
  return text;
}

std::string trim(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
}

std::string seconds(std::chrono::milliseconds limit) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", std::chrono::duration<double>(limit).count());
  return text;
}

std::string lastLine(const std::string& text) {
  std::string last;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return trim(last);
}

HealthProblem userCheck(const HealthOptions& options) {
  // Before the spawn: timeout(1) counts from a moment after it, so a check it killed has
  // always run the whole timeout by this clock.
  const auto started = std::chrono::steady_clock::now();
  // The exit status on stdout: the agent's own reaping may take the shell's status first.
  // timeout(1) kills the check's whole process group when its time is up.
  ToolRun run("--health-check", {"/bin/sh", "-c",
                                 "timeout -s KILL \"$2\" /bin/sh -c \"$1\"; s=$?; echo; echo \"" +
                                     std::string(kExitMark) + "$s\"",
                                 "dlrun-health-check", *options.command, seconds(options.timeout)});
  run.finishWithin(options.timeout + kWrapperGrace);
  const CheckOutput said = readCheckOutput(run.out(), run.err());
  if (said.exitCode == 0) return std::nullopt;
  const std::string which = "--health-check '" + *options.command + "'";
  if (!said.exitCode || std::chrono::steady_clock::now() - started >= options.timeout)
    return which + " did not finish in " + seconds(options.timeout) + " s";
  return which + " failed (exit code " + std::to_string(*said.exitCode) + ")" +
         (said.reason.empty() ? "" : ": " + said.reason);
}

}  // namespace

CheckOutput readCheckOutput(const std::string& out, const std::string& err) {
  CheckOutput said;
  std::string own = out;
  const size_t mark = out.rfind(kExitMark);
  if (mark != std::string::npos && (mark == 0 || out[mark - 1] == '\n')) {
    said.exitCode = parseInteger<int>(trim(out.substr(mark + kExitMark.size())));
    own = out.substr(0, mark);
  }
  said.reason = lastLine(err);
  if (said.reason.empty()) said.reason = lastLine(own);
  if (said.reason.size() > 200) said.reason = said.reason.substr(0, 200) + "...";
  return said;
}

HealthProblem spaceProblem(const std::string& where, uint64_t freeBytes, uint64_t minFreeBytes) {
  if (freeBytes >= minFreeBytes) return std::nullopt;
  return "only " + gib(freeBytes) + " free " + where + ", under --health-min-free's " +
         gib(minFreeBytes);
}

std::optional<uint64_t> availableMemory(const std::string& meminfo) {
  std::istringstream lines(meminfo);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with("MemAvailable:")) continue;
    std::istringstream fields(line.substr(13));
    uint64_t kib = 0;
    if (fields >> kib) return kib * 1024;
  }
  return std::nullopt;
}

HealthProblem checkHealth(const HealthOptions& options) {
  if (options.minFreeBytes > 0) {
    for (const fs::path& dir : options.dirs) {
      struct statvfs fs;
      if (::statvfs(dir.c_str(), &fs) != 0) continue;  // not made yet: its parent's turn
      if (auto problem = spaceProblem("in " + dir.string(), uint64_t{fs.f_bavail} * fs.f_frsize,
                                      options.minFreeBytes))
        return problem;
    }
    std::ifstream in(options.meminfo);
    const std::string meminfo{std::istreambuf_iterator<char>(in), {}};
    if (const auto memory = availableMemory(meminfo))
      if (auto problem = spaceProblem("memory", *memory, options.minFreeBytes)) return problem;
  }
  if (auto problem = checkGpus(options.nvml, options.gpus, options.timeout)) return problem;
  if (options.command) return userCheck(options);
  return std::nullopt;
}

}  // namespace dlrun::agents
