#include "agents/limits.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "common/error.h"

namespace dlrun::agents {
namespace {

constexpr size_t kKiB = 1024;
constexpr size_t kMiB = 1024 * kKiB;

std::string kib(size_t bytes) { return std::to_string((bytes + kKiB - 1) / kKiB) + " KiB"; }

// The soft limit this process started with, once raiseDescriptorLimit() raised it.
std::atomic<long long> startingSoftLimit{-1};

}  // namespace

ExecLimits ExecLimits::forStack(size_t stackSoftLimit, size_t pageSize) {
  ExecLimits limits;
  limits.maxString = 32 * pageSize;  // MAX_ARG_STRLEN
  // bprm_stack_limits(): 3/4 of _STK_LIM (8 MiB) at most, a quarter of the stack limit, and
  // never below ARG_MAX (128 KiB).
  limits.maxTotal = std::max(std::min(6 * kMiB, stackSoftLimit / 4), 128 * kKiB);
  return limits;
}

ExecLimits ExecLimits::ofThisProcess() {
  rlimit stack{};
  const size_t soft = ::getrlimit(RLIMIT_STACK, &stack) == 0 && stack.rlim_cur != RLIM_INFINITY
                          ? static_cast<size_t>(stack.rlim_cur)
                          : SIZE_MAX;
  return forStack(soft, static_cast<size_t>(::sysconf(_SC_PAGESIZE)));
}

void ExecSizes::add(size_t length) {
  ++count;
  bytes += length + 1;
  longest = std::max(longest, length + 1);
}

void ExecSizes::add(const ExecSizes& more) {
  count += more.count;
  bytes += more.bytes;
  longest = std::max(longest, more.longest);
}

std::optional<std::string> execProblem(const ExecSizes& sizes, const ExecLimits& limits) {
  if (sizes.longest > limits.maxString)
    return "one of its arguments or environment variables takes " + std::to_string(sizes.longest) +
           " bytes, over the kernel's limit of " + std::to_string(limits.maxString) + " bytes (" +
           kib(limits.maxString) + ") for one string";
  // execve also places a pointer to each string on the new stack.
  const size_t total = sizes.bytes + sizes.count * sizeof(void*);
  if (total > limits.maxTotal)
    return "its arguments and environment take " + std::to_string(total) +
           " bytes, over the kernel's limit of " + std::to_string(limits.maxTotal) + " bytes (" +
           kib(limits.maxTotal) + ", a quarter of the stack limit, ulimit -s) for one exec";
  return std::nullopt;
}

std::optional<std::string> descriptorProblem(const DescriptorNeeds& needs, size_t limit) {
  if (static_cast<size_t>(needs.total()) <= limit) return std::nullopt;
  std::string parts = std::to_string(needs.workerFiles) + " for their pipes and log files";
  if (needs.storeClients > 0)
    parts += ", " + std::to_string(needs.storeClients) + " for their connections to the store";
  parts += ", " + std::to_string(needs.inUse + DescriptorNeeds::kReserve) + " for the agent";
  return std::to_string(needs.workers) + " workers need about " + std::to_string(needs.total()) +
         " file descriptors (" + parts + "), over the limit of " + std::to_string(limit) +
         " (ulimit -n, already raised to the hard limit); raise the hard limit or start fewer "
         "workers per node (--nproc-per-node)";
}

int openDescriptors() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  int count = 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  ::closedir(dir);
  return std::max(0, count - 1);  // less the directory's own
}

size_t raiseDescriptorLimit() {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) != 0)
    throw Error(std::string("cannot read the descriptor limit: ") + std::strerror(errno));
  if (files.rlim_cur < files.rlim_max) {
    const rlim_t before = files.rlim_cur;
    files.rlim_cur = files.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &files) != 0)
      throw Error(std::string("cannot raise the descriptor limit: ") + std::strerror(errno));
    long long expected = -1;
    startingSoftLimit.compare_exchange_strong(expected, static_cast<long long>(before));
  }
  return files.rlim_cur == RLIM_INFINITY ? SIZE_MAX : static_cast<size_t>(files.rlim_cur);
}

std::optional<size_t> workerDescriptorLimit() {
  const long long limit = startingSoftLimit.load();
  if (limit < 0) return std::nullopt;
  return static_cast<size_t>(limit);
}

}  // namespace dlrun::agents
