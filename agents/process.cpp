#include "agents/process.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <utility>

#include "agents/limits.h"
#include "agents/numa_binding.h"
#include "common/error.h"
#include "common/signal_name.h"

namespace dlrun::agents {
namespace {

// Where a child's stdin, stdout and stderr wait between its clone and its exec. They are reserved
// at the first start, while the agent holds few descriptors, so they sit low in the table: the
// child then copies only the descriptors below them. Between starts they hold /dev/null.
struct ParkingSlots {
  static ParkingSlots& get() {
    static ParkingSlots slots;
    return slots;
  }

  std::mutex mutex;  // one start at a time uses the slots and the stack
  int null = -1, in = -1, out = -1, err = -1;
  // The child's, until its exec; uninitialised, so only the pages it uses are faulted in.
  std::unique_ptr<char[]> stack;
  size_t stackSize = 0;

  unsigned end() const { return static_cast<unsigned>(std::max({null, in, out, err})) + 1; }

 private:
  ParkingSlots() {
    null = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) in = ::fcntl(null, F_DUPFD_CLOEXEC, 0);
    if (in >= 0) out = ::fcntl(null, F_DUPFD_CLOEXEC, 0);
    if (out >= 0) err = ::fcntl(null, F_DUPFD_CLOEXEC, 0);
    if (err < 0) {
      const std::string reason = std::strerror(errno);
      for (int fd : {null, in, out}) {
        if (fd >= 0) ::close(fd);
      }
      throw Error("cannot reserve descriptors for starting workers: " + reason);
    }
  }
};

// What the child needs; it shares the parent's memory, so `error` comes back by itself.
struct ChildContext {
  char** argv = nullptr;
  char** envp = nullptr;
  pid_t agent = -1;
  int stdinSlot = -1;   // -1: the agent's own stdin
  int stdoutSlot = -1;  // -1: the agent's own stream
  int stderrSlot = -1;
  unsigned keepBelow = 3;
  rlim_t descriptorLimit = RLIM_INFINITY;  // the worker's soft RLIMIT_NOFILE; INFINITY: as is
  const cpu_set_t* cpus = nullptr;         // the worker's CPUs (--numa-binding); null: the agent's
  size_t cpusSize = 0;
  volatile int error = 0;         // errno of a failed exec (or of a failed set-up before it)
  volatile bool pinning = false;  // `error` is sched_setaffinity's
};

// Runs in the child between clone and exec, in the agent's memory on a stack of its own, with
// every signal blocked: only async-signal-safe calls, nothing that allocates.
int becomeWorker(void* arg) {
  ChildContext& c = *static_cast<ChildContext*>(arg);
  // A descriptor table of its own holding only the descriptors below the slots.
  if (::close_range(c.keepBelow, ~0U, CLOSE_RANGE_UNSHARE) != 0) {
    c.error = errno;
    ::_exit(127);
  }
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != c.agent) ::_exit(127);  // the agent died before the line above
  // The agent and its descendants may attach (Yama's ptrace_scope=1 allows ancestors only): the
  // stack tools the agent starts for a hang report are the worker's siblings. Yama ties the
  // exception to this process until either process is gone, so it holds across the exec. A bare
  // system call, as PR_SET_PDEATHSIG's above; without Yama it fails (EINVAL), changing nothing.
  ::prctl(PR_SET_PTRACER, c.agent);
  if (c.descriptorLimit != RLIM_INFINITY) {
    rlimit files{};
    if (::getrlimit(RLIMIT_NOFILE, &files) == 0) {
      files.rlim_cur = std::min(c.descriptorLimit, files.rlim_max);
      ::setrlimit(RLIMIT_NOFILE, &files);
    }
  }
  // The agent's handlers must never run here (this is still the agent's memory); what the
  // agent ignores stays ignored across the exec, except SIGPIPE, which workers expect.
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction action;
    if (::sigaction(sig, nullptr, &action) != 0) continue;
    const bool handled = action.sa_handler != SIG_DFL && action.sa_handler != SIG_IGN;
    if (handled || (sig == SIGPIPE && action.sa_handler == SIG_IGN)) {
      struct sigaction byDefault {};
      byDefault.sa_handler = SIG_DFL;
      ::sigaction(sig, &byDefault, nullptr);
    }
  }
  if (c.cpus != nullptr && ::sched_setaffinity(0, c.cpusSize, c.cpus) != 0) {
    c.error = errno;
    c.pinning = true;
    ::_exit(127);
  }
  if (c.stdinSlot >= 0) ::dup2(c.stdinSlot, STDIN_FILENO);
  if (c.stdoutSlot >= 0) ::dup2(c.stdoutSlot, STDOUT_FILENO);
  if (c.stderrSlot >= 0) ::dup2(c.stderrSlot, STDERR_FILENO);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::execvpe(c.argv[0], c.argv, c.envp);
  c.error = errno;
  ::_exit(127);
}

// A CPU set of any size (CPU_ALLOC), for sched_setaffinity; none for an empty list.
class CpuMask {
 public:
  explicit CpuMask(const std::vector<int>& cpus) {
    if (cpus.empty()) return;
    const int count = *std::max_element(cpus.begin(), cpus.end()) + 1;
    set_ = CPU_ALLOC(count);
    if (set_ == nullptr) throw Error("cannot allocate a CPU set of " + std::to_string(count));
    size_ = CPU_ALLOC_SIZE(count);
    CPU_ZERO_S(size_, set_);
    for (int cpu : cpus) CPU_SET_S(static_cast<size_t>(cpu), size_, set_);
  }
  ~CpuMask() {
    if (set_ != nullptr) CPU_FREE(set_);
  }
  CpuMask(const CpuMask&) = delete;
  CpuMask& operator=(const CpuMask&) = delete;
  const cpu_set_t* set() const { return set_; }
  size_t size() const { return size_; }

 private:
  cpu_set_t* set_ = nullptr;
  size_t size_ = 0;
};

// Both ends of a pipe, closed unless taken.
struct Pipe {
  int read = -1, write = -1;
  ~Pipe() {
    for (int fd : {read, write}) {
      if (fd >= 0) ::close(fd);
    }
  }
  void open() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0)
      throw Error(std::string("cannot create a pipe for a worker: ") + std::strerror(errno));
    read = fds[0];
    write = fds[1];
  }
  // Moves the child's end (the write end, or the read end of a stdin pipe) into `slot`
  // (closing what was there); returns the slot, or -1.
  int parkIn(int slot, bool readEnd = false) {
    int& end = readEnd ? read : write;
    if (end < 0) return -1;
    ::dup3(end, slot, O_CLOEXEC);
    ::close(end);
    end = -1;
    return slot;
  }
  int takeRead() {
    if (read >= 0) ::fcntl(read, F_SETFL, ::fcntl(read, F_GETFL) | O_NONBLOCK);
    return std::exchange(read, -1);
  }
};

}  // namespace

SpawnedProcess spawnProcess(const SpawnRequest& request) {
  if (request.argv.empty()) throw Error("cannot start a worker: empty command");
  std::vector<char*> argv;
  argv.reserve(request.argv.size() + 1);
  for (const auto& s : request.argv) argv.push_back(const_cast<char*>(s.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  envp.reserve(request.sharedEnvp.size() + request.envp.size() + 1);
  for (const auto& s : request.sharedEnvp) envp.push_back(const_cast<char*>(s.c_str()));
  for (const auto& s : request.envp) envp.push_back(const_cast<char*>(s.c_str()));
  envp.push_back(nullptr);

  Pipe in, out, err;
  if (request.pipeStdin) in.open();
  if (request.pipeStdout) out.open();
  if (request.pipeStderr) err.open();

  ParkingSlots& slots = ParkingSlots::get();
  std::lock_guard lock(slots.mutex);
  ChildContext child;
  child.argv = argv.data();
  child.envp = envp.data();
  child.agent = ::getpid();
  if (request.nullStdin) child.stdinSlot = slots.null;
  if (request.pipeStdin) child.stdinSlot = in.parkIn(slots.in, true);
  if (request.stdinFrom >= 0 && ::dup3(request.stdinFrom, slots.in, O_CLOEXEC) >= 0)
    child.stdinSlot = slots.in;
  child.stdoutSlot = out.parkIn(slots.out);
  child.stderrSlot = err.parkIn(slots.err);
  child.keepBelow = slots.end();
  if (auto limit = workerDescriptorLimit()) child.descriptorLimit = *limit;
  // Made here: the child may not allocate.
  const CpuMask cpus(request.cpus);
  child.cpus = cpus.set();
  child.cpusSize = cpus.size();
  // Room for execvpe's own needs (a PATH candidate, a script's argv) on top of a safe margin.
  const size_t stackSize = 64 * 1024 + argv.size() * sizeof(char*) * 2;
  if (slots.stackSize < stackSize) {
    slots.stack.reset(new char[stackSize]);
    slots.stackSize = stackSize;
  }
  auto top = reinterpret_cast<uintptr_t>(slots.stack.get() + slots.stackSize);
  void* stackTop = reinterpret_cast<void*>(top & ~uintptr_t{15});

  // Blocked until the child has reset the handlers it borrowed, so none runs in the child.
  sigset_t all, old;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, &old);
  // CLONE_VFORK: this thread resumes once the child has exec'd or exited.
  int pidfd = -1;
  const int flags =
      CLONE_VM | CLONE_VFORK | CLONE_FILES | SIGCHLD | (request.wantPidfd ? CLONE_PIDFD : 0);
  const pid_t pid = ::clone(becomeWorker, stackTop, flags, &child, &pidfd);
  const int cloneError = errno;
  ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
  // The child has its own copies now; the slots go back to /dev/null.
  ::dup3(slots.null, slots.in, O_CLOEXEC);
  ::dup3(slots.null, slots.out, O_CLOEXEC);
  ::dup3(slots.null, slots.err, O_CLOEXEC);

  if (pid < 0)
    throw Error("cannot start " + request.argv[0] + ": fork: " + std::strerror(cloneError));
  if (child.error != 0) {
    if (pidfd >= 0) ::close(pidfd);
    ::waitpid(pid, nullptr, 0);
    if (child.pinning)
      throw Error("cannot run " + request.argv[0] + " on CPUs " + cpuListText(request.cpus) +
                  " (--numa-binding): " + std::strerror(child.error));
    throw Error("cannot execute " + request.argv[0] + ": " + std::strerror(child.error));
  }
  return {.pid = pid,
          .stdoutFd = out.takeRead(),
          .stderrFd = err.takeRead(),
          .stdinFd = std::exchange(in.write, -1),
          .pidfd = pidfd};
}

ExitStatus ExitStatus::fromWaitStatus(int status) {
  if (WIFSIGNALED(status)) return {true, WTERMSIG(status)};
  return {false, WEXITSTATUS(status)};
}

std::string ExitStatus::describe() const {
  return signaled ? "signal " + signalName(value) : "exit code " + std::to_string(value);
}

std::optional<ReapedChild> reapChild(const std::function<bool(pid_t)>& holdGroup) {
  for (;;) {
    siginfo_t info{};
    // WNOWAIT: the child stays a zombie, its number its own, until it is reaped below.
    if (::waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0)
      return std::nullopt;
    ReapedChild child{.pid = info.si_pid};
    if (holdGroup(child.pid))
      child.groupFd = static_cast<int>(::syscall(SYS_pidfd_open, child.pid, 0));
    int status = 0;
    if (::waitpid(child.pid, &status, WNOHANG) == child.pid) {
      child.status = ExitStatus::fromWaitStatus(status);
      return child;
    }
    // Reaped meanwhile through its own pidfd on another thread (a stack tool, stack_dump.h).
    if (child.groupFd >= 0) ::close(child.groupFd);
  }
}

namespace {

// Linux 6.9's flag of pidfd_send_signal (glibc's headers may predate it).
constexpr unsigned kSignalProcessGroup = 1U << 2;

// Whether /proc shows a process of this number, and a member of group `group` that is this
// process's child.
struct GroupSighting {
  bool numberTaken = false;
  bool childMember = false;
};

GroupSighting sightGroup(pid_t group) {
  GroupSighting seen;
  const pid_t self = ::getpid();
  std::error_code ec;
  seen.numberTaken = std::filesystem::exists("/proc/" + std::to_string(group), ec);
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    std::ifstream stat(entry.path() / "stat");
    std::string text;
    if (!stat || !std::getline(stat, text)) continue;
    // "pid (comm) state ppid pgrp ...": comm may hold anything, so read after its last ')'.
    const size_t end = text.rfind(')');
    if (end == std::string::npos) continue;
    char state = 0;
    long ppid = 0, pgrp = 0;
    if (std::sscanf(text.c_str() + end + 1, " %c %ld %ld", &state, &ppid, &pgrp) != 3) continue;
    if (pgrp == group && ppid == self) seen.childMember = true;
  }
  return seen;
}

}  // namespace

void signalReapedGroup(int groupFd, pid_t group, int sig) {
  if (groupFd >= 0 &&
      ::syscall(SYS_pidfd_send_signal, groupFd, sig, nullptr, kSignalProcessGroup) == 0)
    return;
  if (groupFd >= 0 && errno == ESRCH) return;  // nothing of the group is left
  const GroupSighting seen = sightGroup(group);
  if (seen.childMember && !seen.numberTaken) ::kill(-group, sig);
}

void becomeSubreaper() {
  if (::prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
    throw Error(std::string("cannot become a child subreaper: ") + std::strerror(errno));
}

char processState(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  const std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');  // after the command, which may hold anything
  return paren == std::string::npos || paren + 2 >= stat.size() ? 0 : stat[paren + 2];
}

}  // namespace dlrun::agents
