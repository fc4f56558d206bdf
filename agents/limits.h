// What the kernel lets one node's start use, checked before the first worker starts so a large
// job fails at once with one line instead of half-way through: the size of one exec (its
// arguments and environment) and the number of open descriptors. The checks are pure (tests
// give them sizes and limits); only ofThisProcess(), openDescriptors() and
// raiseDescriptorLimit() read the process.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace dlrun::agents {

// Linux's limits on execve (fs/exec.c): one argument or environment string (MAX_ARG_STRLEN),
// and all strings with their pointers together (a quarter of the stack limit, capped at 6 MiB,
// at least 128 KiB).
struct ExecLimits {
  size_t maxString = 32 * 4096;       // bytes of one "KEY=VALUE" or argument, its NUL included
  size_t maxTotal = 2 * 1024 * 1024;  // bytes of every string, NULs and pointers included

  static ExecLimits forStack(size_t stackSoftLimit, size_t pageSize);  // pure
  static ExecLimits ofThisProcess();  // from RLIMIT_STACK and the page size
};

// What one exec passes: its strings, each counted with its NUL.
struct ExecSizes {
  size_t count = 0;
  size_t bytes = 0;
  size_t longest = 0;
  void add(size_t length);  // one string of `length` characters
  void add(const ExecSizes& more);
};

// Why an exec of these sizes would fail with "Argument list too long", or nothing.
std::optional<std::string> execProblem(const ExecSizes& sizes, const ExecLimits& limits);

// The descriptors a node needs while its workers run.
struct DescriptorNeeds {
  int inUse = 0;  // open before the first worker starts
  int workers = 0;
  int workerFiles = 0;  // the workers' output pipes and log files, all together
  // connections from this node's workers to a store (or a store proxy) this process serves
  int storeClients = 0;
  // The event loop, the rendezvous's and the store's own connections, a start's pipes in
  // flight, the parking slots, and room to spare.
  static constexpr int kReserve = 64;
  int total() const { return inUse + kReserve + workerFiles + storeClients; }
};

// Why `needs` cannot fit under the soft limit `limit`, in one line naming it, or nothing.
std::optional<std::string> descriptorProblem(const DescriptorNeeds& needs, size_t limit);

// Counts this process's open descriptors.
int openDescriptors();
// Raises the soft RLIMIT_NOFILE to the hard one (where it is lower) and returns the soft limit.
size_t raiseDescriptorLimit();
// The soft limit workers get back: the one this process started with, once it was raised (a
// program that closes every descriptor up to its limit stays fast).
std::optional<size_t> workerDescriptorLimit();

}  // namespace dlrun::agents
