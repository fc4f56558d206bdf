#include "agents/stack_dump.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

#include "agents/process.h"
#include "agents/stack_text.h"
#include "common/clock.h"
#include "common/error.h"

namespace dlrun::agents {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// A file another process writes is complete once it changed and then held still this long
// (faulthandler and torch write their dumps in one go, in well under a millisecond).
constexpr milliseconds kSettle{50};
// How often files are looked at while something waits on one.
constexpr milliseconds kTick{10};
// A tool's output beyond this is dropped (a process of thousands of threads).
constexpr size_t kMaxToolOutput = 8 << 20;
// How long a killed tool may take to go (SIGKILL: at once, unless the machine is stuck).
constexpr milliseconds kKillWait{1000};
// waitid's P_PIDFD (Linux 5.4), which glibc 2.36's <sys/wait.h> does not name yet.
constexpr auto kByPidfd = static_cast<idtype_t>(3);

std::string errnoText(int error) { return std::strerror(error); }

// pidfds: signals and waits that reach the process meant, never one that took its pid after it
// was reaped (by the agent's waitpid(-1) as likely as by this code). The system calls direct:
// glibc 2.36's <sys/pidfd.h> declares its wrappers without C linkage.
int pidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }
int pidfdSignal(int pidfd, int sig) {
  return static_cast<int>(::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0));
}

std::optional<fs::path> findProgram(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string_view dirs = path ? path : "/usr/bin:/bin";
  while (true) {
    const size_t colon = dirs.find(':');
    const std::string_view dir = dirs.substr(0, colon);
    if (!dir.empty()) {
      fs::path candidate = fs::path(dir) / name;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    if (colon == std::string_view::npos) return std::nullopt;
    dirs.remove_prefix(colon + 1);
  }
}

// The tools' environment: the agent's, in the C locale (their messages are read), without
// DEBUGINFOD_URLS, which would have eu-stack and gdb download debug files while a job hangs.
std::vector<std::string> toolEnvironment() {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string_view item(*entry);
    if (item.starts_with("DEBUGINFOD_URLS=") || item.starts_with("LC_ALL=")) continue;
    env.emplace_back(item);
  }
  env.emplace_back("LC_ALL=C");
  return env;
}

std::string readFile(const fs::path& path, std::streamoff from = 0) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(from);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// A process's environment as it started (/proc/PID/environ).
Environment environmentOf(pid_t pid) {
  Environment env;
  const std::string raw = readFile("/proc/" + std::to_string(pid) + "/environ");
  std::string_view rest(raw);
  while (!rest.empty()) {
    const size_t end = rest.find('\0');
    const std::string_view item = rest.substr(0, end);
    if (const size_t eq = item.find('='); eq != std::string_view::npos)
      env.emplace(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
    if (end == std::string_view::npos) break;
    rest.remove_prefix(end + 1);
  }
  return env;
}

// A path as the process `pid` means it: a relative one is relative to its working directory.
fs::path asSeenBy(pid_t pid, const fs::path& path) {
  return path.is_absolute() ? path : fs::path("/proc/" + std::to_string(pid) + "/cwd") / path;
}

// The state letter of /proc/PID/stat ('T': stopped), or 0 when the process is gone.
char stateOf(pid_t pid) {
  const std::string stat = readFile("/proc/" + std::to_string(pid) + "/stat");
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() ? 0 : stat[paren + 2];
}

// Whether `pid` holds `file` open: the hook's proof that it lives in that process now (a
// program the process exec'd since has lost it; Python opens files close-on-exec).
bool holdsOpen(pid_t pid, const fs::path& file) {
  std::error_code error;
  const fs::path wanted = fs::weakly_canonical(file, error);
  if (error) return false;
  // Without exceptions: descriptors come and go while this reads, and so may the process.
  for (fs::directory_iterator it("/proc/" + std::to_string(pid) + "/fd", error);
       !error && it != fs::directory_iterator(); it.increment(error)) {
    std::error_code linkError;
    if (fs::read_symlink(it->path(), linkError) == wanted) return true;
  }
  return false;
}

struct FileMark {
  bool exists = false;
  off_t size = 0;
  timespec mtime{};
  bool operator==(const FileMark& o) const {
    return exists == o.exists && size == o.size && mtime.tv_sec == o.mtime.tv_sec &&
           mtime.tv_nsec == o.mtime.tv_nsec;
  }
};

FileMark markOf(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return {true, st.st_size, st.st_mtim};
}

// A file that another process is about to write: settled() once it differs from what it was
// when watching began and has not changed for kSettle.
class FileWatch {
 public:
  explicit FileWatch(fs::path path)
      : path_(std::move(path)), before_(markOf(path_)), last_(before_), changed_(Clock::now()) {}

  bool settled(Clock::time_point now) {
    const FileMark mark = markOf(path_);
    if (!(mark == last_)) {
      last_ = mark;
      changed_ = now;
    }
    return last_.exists && !(last_ == before_) && now - changed_ >= kSettle;
  }
  const fs::path& path() const { return path_; }
  off_t sizeBefore() const { return before_.size; }

 private:
  fs::path path_;
  FileMark before_, last_;
  Clock::time_point changed_;
};

// One run of eu-stack or gdb: its output gathered while it runs, killed when time is up.
class ToolRun {
 public:
  ToolRun(std::string name, std::vector<std::string> argv)
      : name_(std::move(name)),
        process_(spawnProcess({.argv = std::move(argv),
                               .envp = toolEnvironment(),
                               .pipeStdout = true,
                               .pipeStderr = true,
                               .nullStdin = true,
                               .wantPidfd = true})) {}
  ToolRun(const ToolRun&) = delete;
  ToolRun& operator=(const ToolRun&) = delete;
  ~ToolRun() {
    if (!exited_) kill();
    for (int fd : {process_.stdoutFd, process_.stderrFd, process_.pidfd}) {
      if (fd >= 0) ::close(fd);
    }
  }

  void addPollFds(std::vector<pollfd>& fds) const {
    if (exited_) return;
    for (int fd : {process_.stdoutFd, process_.stderrFd, process_.pidfd})
      fds.push_back({fd, POLLIN, 0});
  }

  // Reads what the tool wrote; true once it has exited and all it wrote was read.
  bool advance() {
    if (exited_) return true;
    // Exit first: what it wrote before is in the pipes by then.
    pollfd exit{process_.pidfd, POLLIN, 0};
    const bool gone = ::poll(&exit, 1, 0) == 1;
    drain(process_.stdoutFd, out_);
    drain(process_.stderrFd, err_);
    if (gone) reap();
    return exited_;
  }

  // SIGKILL through the pidfd (never a recycled pid), then waits for the exit.
  void kill() {
    pidfdSignal(process_.pidfd, SIGKILL);
    pollfd exit{process_.pidfd, POLLIN, 0};
    ::poll(&exit, 1, static_cast<int>(kKillWait.count()));
    killed_ = true;
    reap();
  }

  const std::string& name() const { return name_; }
  const std::string& out() const { return out_; }
  // Killed, or ended by a signal: it may have died while attached (see TargetDump::resume).
  bool diedAttached() const { return killed_ || (status_ && status_->signaled); }
  // The exit status is lost where the caller reaped the tool first.
  bool statusKnown() const { return status_.has_value(); }
  // "exit code 1: <its message>", for the report's notes; empty after a clean run.
  std::string trouble() const {
    std::string what;
    if (killed_) what = "killed at the deadline";
    else if (status_ && !status_->success()) what = status_->describe();
    const std::string_view message = [&] {
      std::string_view m(err_);
      while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.remove_suffix(1);
      return m;
    }();
    if (!message.empty()) what += (what.empty() ? "" : ": ") + std::string(message);
    if (message.find("Operation not permitted") != std::string_view::npos ||
        message.find("Permission denied") != std::string_view::npos)
      what +=
          " (ptrace refused: see /proc/sys/kernel/yama/ptrace_scope, or another user's process)";
    return what;
  }

 private:
  void drain(int fd, std::string& into) {
    char buffer[65536];
    ssize_t n;
    while ((n = ::read(fd, buffer, sizeof buffer)) > 0) {
      const size_t room = kMaxToolOutput - std::min(kMaxToolOutput, into.size());
      into.append(buffer, std::min(static_cast<size_t>(n), room));
    }
  }

  // The status, unless the caller's waitpid(-1) took it first (ECHILD): the output tells.
  void reap() {
    siginfo_t info{};
    if (::waitid(kByPidfd, process_.pidfd, &info, WEXITED | WNOHANG) == 0 &&
        info.si_pid != 0)
      status_ = info.si_code == CLD_EXITED ? ExitStatus{false, info.si_status}
                                           : ExitStatus{true, info.si_status};
    exited_ = true;
    drain(process_.stdoutFd, out_);
    drain(process_.stderrFd, err_);
  }

  std::string name_;
  SpawnedProcess process_;
  std::string out_, err_;
  bool exited_ = false, killed_ = false;
  std::optional<ExitStatus> status_;
};

struct Tools {
  std::optional<fs::path> euStack = findProgram("eu-stack");
  std::optional<fs::path> gdb = findProgram("gdb");
};

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

// One target's collection: Python stacks, then native ones; the flight recorder alongside.
class TargetDump {
 public:
  TargetDump(const StackTarget& target, const PythonStackHook* hook, const Tools& tools,
             Clock::time_point start, milliseconds timeout)
      : target_(target), tools_(tools) {
    dump_.pid = target.pid;
    dump_.rank = target.rank;
    pidfd_ = target.pid > 0 ? pidfdOpen(target.pid) : -1;
    if (pidfd_ < 0) {
      const int error = target.pid > 0 ? errno : ESRCH;
      dump_.error = error == ESRCH
                        ? "process " + std::to_string(target.pid) + " is gone"
                        : "cannot open process " + std::to_string(target.pid) + ": " + errnoText(error);
      step_ = Step::Done;
      return;
    }
    stoppedBefore_ = stateOf(target.pid) == 'T';
    pokeFlightRecorder(environmentOf(target.pid));
    const fs::path pyFile = hook ? hook->dir() / ("py-" + std::to_string(target.pid) + ".txt")
                                 : fs::path();
    if (hook && holdsOpen(target.pid, pyFile)) {
      python_.emplace(pyFile);
      if (pidfdSignal(pidfd_, PythonStackHook::signal()) == 0) {
        // A third of the time, so the native stacks still get theirs.
        pythonUntil_ = start + timeout / 3;
        step_ = Step::Python;
        return;
      }
      notes_.push_back("cannot signal the Python hook: " + errnoText(errno));
      python_.reset();
    } else if (hook) {
      notes_.emplace_back("no Python stacks: the process has not loaded dlrun's hook (not "
                          "Python, or Python without site or PYTHONPATH)");
    }
    startNative();
  }
  TargetDump(const TargetDump&) = delete;
  TargetDump& operator=(const TargetDump&) = delete;
  ~TargetDump() {
    if (pidfd_ >= 0) ::close(pidfd_);
  }

  void advance(Clock::time_point now) {
    if (step_ == Step::Python) {
      if (python_->settled(now)) {
        pythonText_ = readFile(python_->path(), python_->sizeBefore());
        startNative();
      } else if (now >= pythonUntil_) {
        notes_.emplace_back("no Python stacks: the hook did not answer in time");
        startNative();
      }
    }
    if (step_ == Step::Native && tool_->advance()) {
      finishTool();
      if (nativeThreads_.empty() && tool_->name() == "eu-stack" && tools_.gdb) {
        startTool("gdb");
      } else {
        step_ = Step::Done;
      }
    }
    for (auto& dump : ncclDumps_) {
      if (dump.settled(now)) {
        copyFlightRecorder(dump.path());
        ncclDumps_.clear();
        return;
      }
    }
  }

  bool done() const { return step_ == Step::Done && ncclDumps_.empty(); }
  bool waitsOnFiles() const { return step_ == Step::Python || !ncclDumps_.empty(); }
  void addPollFds(std::vector<pollfd>& fds) const {
    if (step_ == Step::Native) tool_->addPollFds(fds);
  }

  // The deadline passed: stop what still runs.
  void expire() {
    if (step_ == Step::Python)
      notes_.emplace_back("no Python stacks: the hook did not answer in time");
    if (step_ == Step::Native) {
      tool_->kill();
      finishTool();
    }
    step_ = Step::Done;
    if (!ncclDumps_.empty()) {
      notes_.emplace_back("the NCCL flight recorder wrote no dump in time");
      ncclDumps_.clear();
    }
  }

  StackDump result() && {
    const auto python = parseFaulthandler(pythonText_);
    dump_.topFrames = topFrames(python, nativeThreads_);
    dump_.collective = findCollective(python, nativeThreads_);
    if (python.empty() && nativeThreads_.empty() && dump_.error.empty()) {
      dump_.error = "no stack could be taken";
      for (const auto& note : notes_) dump_.error += "; " + note;
    }
    dump_.text = report(python.empty() ? "" : pythonText_);
    if (!target_.outFile.empty()) {
      if (const std::string trouble = write(target_.outFile, dump_.text); !trouble.empty())
        dump_.error += (dump_.error.empty() ? "" : "; ") + trouble;
    }
    return std::move(dump_);
  }

 private:
  enum class Step { Python, Native, Done };

  void startNative() {
    if (tools_.euStack) return startTool("eu-stack");
    if (tools_.gdb) return startTool("gdb");
    notes_.emplace_back("no native stacks: neither eu-stack nor gdb is installed (Debian: "
                        "apt-get install elfutils)");
    step_ = Step::Done;
  }

  void startTool(const std::string& name) {
    const std::string pid = std::to_string(target_.pid);
    std::vector<std::string> argv;
    if (name == "eu-stack") {
      argv = {tools_.euStack->string(), "-p", pid};
    } else {
      // No debuginfod queries, no scripts from auto-load: a quick, local backtrace.
      argv = {tools_.gdb->string(), "-batch", "-nx", "-iex", "set debuginfod enabled off",
              "-iex", "set auto-load python-scripts off", "-p", pid,
              "-ex", "thread apply all bt"};
    }
    try {
      tool_ = std::make_unique<ToolRun>(name, std::move(argv));
      toolCommand_ = name + " -p " + pid;
      step_ = Step::Native;
    } catch (const Error& e) {
      notes_.emplace_back(e.what());
      step_ = Step::Done;
    }
  }

  void finishTool() {
    if (tool_->diedAttached() || (!tool_->statusKnown() && stateOf(target_.pid) == 'T')) resume();
    nativeThreads_ = tool_->name() == "eu-stack" ? parseEuStack(tool_->out(), target_.pid)
                                                 : parseGdbBacktrace(tool_->out(), target_.pid);
    if (const std::string trouble = tool_->trouble(); !trouble.empty())
      notes_.push_back(tool_->name() + ": " + trouble);
    if (!nativeThreads_.empty()) nativeText_ = tool_->out();
  }

  // A tracer killed while attaching can leave its tracee stopped: PTRACE_ATTACH queues a
  // SIGSTOP that the tracee takes once the tracer is gone. SIGCONT continues it and drops a
  // SIGSTOP still queued. A worker that was stopped before (by its user) stays so.
  void resume() {
    if (!stoppedBefore_) pidfdSignal(pidfd_, SIGCONT);
  }

  // Where the worker's environment names torch's debug pipe, writes to it so the flight
  // recorder dumps its last collectives, and watches where the dump will appear.
  void pokeFlightRecorder(const Environment& env) {
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

  void copyFlightRecorder(const fs::path& from) {
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

  std::string report(const std::string& python) const {
    std::string text = "dlrun stack report: rank " + std::to_string(target_.rank) + ", pid " +
                       std::to_string(target_.pid) + "\n";
    text += "waiting in: " + dump_.collective.value_or("no collective seen") + "\n";
    if (!dump_.topFrames.empty()) {
      text += "top frames:";
      for (const auto& f : dump_.topFrames) text += "\n  " + f;
      text += "\n";
    }
    if (!dump_.error.empty()) text += "error: " + dump_.error + "\n";
    if (!python.empty()) text += "\n== Python stacks (faulthandler) ==\n" + python;
    if (!nativeText_.empty())
      text += "\n== native stacks (" + toolCommand_ + ") ==\n" + nativeText_;
    if (dump_.ncclTrace) {
      text += "\n== NCCL flight recorder ==\ndump: " + dump_.ncclTrace->string() + "\n";
      text += "newest entry: " + dump_.lastNcclCollective.value_or("none found") + "\n";
    }
    if (!notes_.empty()) {
      text += "\n== notes ==\n";
      for (const auto& note : notes_) text += note + "\n";
    }
    return text;
  }

  // Empty, or why the file could not be written.
  static std::string write(const fs::path& path, const std::string& text) {
    std::error_code error;
    fs::create_directories(path.parent_path(), error);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (out) return {};
    return "cannot write the stack report " + path.string() + ": " +
           (error ? error.message() : errnoText(errno));
  }

  const StackTarget& target_;
  const Tools& tools_;
  StackDump dump_;
  int pidfd_ = -1;
  bool stoppedBefore_ = false;
  Step step_ = Step::Done;
  std::optional<FileWatch> python_;
  Clock::time_point pythonUntil_;
  std::string pythonText_;
  std::unique_ptr<ToolRun> tool_;
  std::string toolCommand_;
  std::string nativeText_;
  std::vector<StackThread> nativeThreads_;
  std::vector<FileWatch> ncclDumps_;  // where the flight recorder's dump may appear, until it does
  std::vector<std::string> notes_;
};

}  // namespace

PythonStackHook::PythonStackHook(std::filesystem::path dir) : dir_(fs::absolute(std::move(dir))) {
  std::error_code error;
  fs::create_directories(dir_, error);
  // Written aside and renamed: a Python process starting meanwhile never reads half of it.
  const fs::path file = dir_ / "sitecustomize.py", partial = dir_ / ".sitecustomize.py.part";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out << source(signal());
    out.flush();
    if (!out)
      throw Error("cannot write the Python stack hook " + partial.string() + ": " +
                  (error ? error.message() : errnoText(errno)));
  }
  fs::rename(partial, file, error);
  if (error)
    throw Error("cannot write the Python stack hook " + file.string() + ": " + error.message());
}

Environment PythonStackHook::environment(const Environment& inherited) const {
  std::string path = dir_.string();
  // An empty PYTHONPATH adds nothing; "DIR:" would add the working directory.
  if (auto it = inherited.find("PYTHONPATH"); it != inherited.end() && !it->second.empty())
    path += ":" + it->second;
  return {{"PYTHONPATH", std::move(path)}};
}

int PythonStackHook::signal() { return SIGRTMAX - 4; }

std::string PythonStackHook::source(int signal) {
  const std::string sig = std::to_string(signal);
  return R"(# dlrun's stack hook, written by the dlrun agent (dlrun's ARCHITECTURE.md, section 5).
# On signal )" + sig + R"(, faulthandler writes every thread's Python stack to py-<pid>.txt next to
# this file; the agent sends that signal, when the job hangs, only to a process holding its file.
# Then the next sitecustomize on sys.path runs, as if this one were not here.


def _dlrun_stack_hook():
    import atexit
    import faulthandler
    import os

    pid = os.getpid()
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "py-%d.txt" % pid)
    # The file gets its name once the handler is in place: before, the signal would kill.
    dump = open(path + ".part", "w")
    try:
        faulthandler.register()" + sig + R"(, file=dump, all_threads=True, chain=False)
        os.rename(path + ".part", path)
    except BaseException:
        faulthandler.unregister()" + sig + R"()
        dump.close()
        os.unlink(path + ".part")
        raise

    def forget():
        # A forked child that exits normally runs this too: the file is its parent's.
        if os.getpid() == pid:
            try:
                os.unlink(path)
            except OSError:
                pass

    atexit.register(forget)
    return dump  # faulthandler writes to it until the process ends


def _dlrun_next_sitecustomize():
    import importlib.machinery
    import importlib.util
    import os
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


try:
    _dlrun_stack_file = _dlrun_stack_hook()
except Exception:
    pass  # no stacks for this process; it runs as without dlrun
_dlrun_next_sitecustomize()
)";
}

std::vector<StackDump> dumpStacks(const std::vector<StackTarget>& targets,
                                  const PythonStackHook* hook, milliseconds timeout) {
  const Tools tools;
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  std::vector<std::unique_ptr<TargetDump>> dumps;
  dumps.reserve(targets.size());
  for (const auto& target : targets)
    dumps.push_back(std::make_unique<TargetDump>(target, hook, tools, start, timeout));

  std::vector<pollfd> fds;
  while (true) {
    const auto now = Clock::now();
    bool done = true, files = false;
    fds.clear();
    for (auto& d : dumps) {
      d->advance(now);
      done = done && d->done();
      files = files || d->waitsOnFiles();
      d->addPollFds(fds);
    }
    if (done || now >= deadline) break;
    // Tools wake the loop through their pipes and pidfds; files are looked at each tick.
    auto wait = std::chrono::ceil<milliseconds>(deadline - now);
    if (files) wait = std::min(wait, kTick);
    ::poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
  }

  std::vector<StackDump> results;
  results.reserve(dumps.size());
  for (auto& d : dumps) {
    if (!d->done()) d->expire();
    results.push_back(std::move(*d).result());
  }
  return results;
}

}  // namespace dlrun::agents
