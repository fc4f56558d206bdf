// dumpStacks (stack_dump.h): each target's collection, step by step, and its report; the
// helpers the parts share. The parts: stack_dump_python.cpp, stack_dump_native.cpp,
// stack_dump_nccl.cpp.
#include "agents/stack_dump.h"

#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>

#include "agents/stack_dump_internal.h"
#include "agents/stack_text.h"
#include "common/clock.h"

namespace dlrun::agents {
namespace stack_dump_detail {
namespace {

// A file another process writes is complete once it changed and then held still this long
// (faulthandler and torch write their dumps in one go, in well under a millisecond).
constexpr milliseconds kSettle{50};

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

FileMark markOf(const fs::path& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return {true, st.st_size, st.st_mtim};
}

}  // namespace

std::string errnoText(int error) { return std::strerror(error); }

// The system call direct: glibc 2.36's <sys/pidfd.h> declares its wrappers without C linkage.
int pidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

std::string readFile(const fs::path& path, std::streamoff from) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(from);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

FileWatch::FileWatch(fs::path path)
    : path_(std::move(path)), before_(markOf(path_)), last_(before_), changed_(Clock::now()) {}

bool FileWatch::settled(Clock::time_point now) {
  const FileMark mark = markOf(path_);
  if (!(mark == last_)) {
    last_ = mark;
    changed_ = now;
  }
  return last_.exists && !(last_ == before_) && now - changed_ >= kSettle;
}

TargetDump::TargetDump(const StackTarget& target, const PythonStackHook* hook, const Tools& tools,
                       Clock::time_point start, milliseconds timeout)
    : target_(target), tools_(tools) {
  dump_.pid = target.pid;
  dump_.rank = target.rank;
  pidfd_ = target.pid > 0 ? pidfdOpen(target.pid) : -1;
  if (pidfd_ < 0) {
    const int error = target.pid > 0 ? errno : ESRCH;
    dump_.error = error == ESRCH ? "process " + std::to_string(target.pid) + " is gone"
                                 : "cannot open process " + std::to_string(target.pid) + ": " +
                                       errnoText(error);
    step_ = Step::Done;
    return;
  }
  stoppedBefore_ = processState(target.pid) == 'T';
  pokeFlightRecorder(environmentOf(target.pid));
  // A stopped process (SIGSTOP) cannot run the Python hook: its native stack only, at once.
  if (stoppedBefore_)
    notes_.emplace_back("no Python stacks: the process is stopped (SIGSTOP, or a tracer's)");
  else if (startPython(hook, start, timeout))
    return;
  startNative();
}

TargetDump::~TargetDump() {
  if (pidfd_ >= 0) ::close(pidfd_);
}

void TargetDump::advance(Clock::time_point now) {
  if (step_ == Step::Python) {
    if (python_->settled(now)) {
      pythonText_ = readFile(python_->path(), python_->sizeBefore());
      if (target_.native) {
        startNative();
      } else {
        notes_.emplace_back("no native stacks: its Python stack alone was asked for");
        step_ = Step::Done;
      }
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

void TargetDump::expire() {
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

StackDump TargetDump::result() && {
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

std::string TargetDump::report(const std::string& python) const {
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
  if (!nativeText_.empty()) text += "\n== native stacks (" + toolCommand_ + ") ==\n" + nativeText_;
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

std::string TargetDump::write(const fs::path& path, const std::string& text) {
  std::error_code error;
  fs::create_directories(path.parent_path(), error);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.flush();
  if (out) return {};
  return "cannot write the stack report " + path.string() + ": " +
         (error ? error.message() : errnoText(errno));
}

}  // namespace stack_dump_detail

std::vector<StackDump> dumpStacks(const std::vector<StackTarget>& targets,
                                  const PythonStackHook* hook, std::chrono::milliseconds timeout) {
  using stack_dump_detail::TargetDump;
  using std::chrono::milliseconds;
  // How often files are looked at while something waits on one.
  constexpr milliseconds kTick{10};
  const stack_dump_detail::Tools tools;
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
