// The NCCL part of the stack reports (stack_dump.h): PyTorch's flight recorder asked through
// its debug pipe for its last collectives, and its dump copied next to the report.
#include "agents/stack_dump_internal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "agents/stack_text.h"

namespace dlrun::agents::stack_dump_detail {
namespace {

// A path as the process `pid` means it: a relative one is relative to its working directory.
fs::path asSeenBy(pid_t pid, const fs::path& path) {
  return path.is_absolute() ? path : fs::path("/proc/" + std::to_string(pid) + "/cwd") / path;
}

// Where torch's flight recorder writes rank `rank`'s dump: TORCH_FR_DUMP_TEMP_FILE, else
// TORCH_NCCL_DEBUG_INFO_TEMP_FILE, else the default of its release (earlier ones:
// /tmp/nccl_trace_rank_; later ones: torch/comm_lib_trace_rank_ under XDG_CACHE_HOME or
// ~/.cache), followed by the rank.
std::vector<fs::path> flightRecorderDumps(const Environment& env, int rank) {
  std::vector<std::string> prefixes;
  for (const char* name : {"TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"}) {
    if (auto it = env.find(name); it != env.end() && !it->second.empty()) {
      prefixes.push_back(it->second);
      break;
    }
  }
  if (prefixes.empty()) {
    prefixes.emplace_back("/tmp/nccl_trace_rank_");
    std::string cache;
    if (auto it = env.find("XDG_CACHE_HOME"); it != env.end() && !it->second.empty()) {
      cache = it->second;
    } else {
      auto home = env.find("HOME");
      cache = (home != env.end() ? home->second : std::string("/tmp")) + "/.cache";
    }
    prefixes.push_back(cache + "/torch/comm_lib_trace_rank_");
    prefixes.push_back(cache + "/torch/nccl_trace_rank_");
  }
  std::vector<fs::path> dumps;
  for (const auto& prefix : prefixes) dumps.emplace_back(prefix + std::to_string(rank));
  return dumps;
}

}  // namespace

// Where the worker's environment names torch's debug pipe, writes to it so the flight
// recorder dumps its last collectives, and watches where the dump will appear.
void TargetDump::pokeFlightRecorder(const Environment& env) {
  const auto stem = env.find("TORCH_NCCL_DEBUG_INFO_PIPE_FILE");
  if (stem == env.end() || stem->second.empty()) return;
  // torch opens <stem><global rank>.pipe when its trace buffer is on, and reads it from the
  // NCCL process group's monitor thread about once a second.
  const fs::path pipe =
      asSeenBy(target_.pid, stem->second + std::to_string(target_.rank) + ".pipe");
  std::vector<FileWatch> dumps;
  for (const auto& path : flightRecorderDumps(env, target_.rank))
    dumps.emplace_back(asSeenBy(target_.pid, path));
  const int fd = ::open(pipe.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    notes_.push_back("no NCCL flight recorder: cannot open " + pipe.string() + ": " +
                     (error == ENXIO ? "nobody reads it (torch does with its trace buffer on: "
                                       "TORCH_NCCL_TRACE_BUFFER_SIZE > 0)"
                                     : errnoText(error)));
    return;
  }
  struct stat st {};
  const bool fifo = ::fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode);
  const bool written = fifo && ::write(fd, "1", 1) == 1;
  const int writeError = errno;
  ::close(fd);
  if (!written) {
    notes_.push_back("no NCCL flight recorder: " + pipe.string() +
                     (fifo ? ": " + errnoText(writeError) : " is not a pipe"));
    return;
  }
  ncclDumps_ = std::move(dumps);
}

void TargetDump::copyFlightRecorder(const fs::path& from) {
  fs::path to = target_.outFile;
  to += ".nccl_trace";
  std::error_code error;
  if (!target_.outFile.empty()) {
    fs::create_directories(to.parent_path(), error);
    fs::copy_file(from, to, fs::copy_options::overwrite_existing, error);
  }
  if (target_.outFile.empty() || error) {
    notes_.push_back("the NCCL flight recorder's dump stays at " + from.string() +
                     (error ? ": cannot copy it: " + error.message() : ""));
    to = from;
  }
  dump_.ncclTrace = to;
  dump_.lastNcclCollective = lastFlightRecorderCollective(readFile(to));
}

}  // namespace dlrun::agents::stack_dump_detail
