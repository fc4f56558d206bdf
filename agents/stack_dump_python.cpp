// The Python part of the stack reports (stack_dump.h): the faulthandler hook dlrun installs in
// Python workers (PythonStackHook, its sitecustomize.py) and the signal that asks it for a dump.
#include "agents/stack_dump.h"

#include <signal.h>

#include <cerrno>
#include <fstream>
#include <utility>

#include "agents/stack_dump_internal.h"
#include "common/error.h"

namespace dlrun::agents {
namespace stack_dump_detail {
namespace {

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

}  // namespace

bool TargetDump::startPython(const PythonStackHook* hook, Clock::time_point start,
                             milliseconds timeout) {
  const fs::path pyFile =
      hook ? hook->dir() / ("py-" + std::to_string(target_.pid) + ".txt") : fs::path();
  if (hook && holdsOpen(target_.pid, pyFile)) {
    python_.emplace(pyFile);
    if (pidfdSignal(pidfd_, PythonStackHook::signal()) == 0) {
      // A third of the time, so the native stacks still get theirs.
      pythonUntil_ = start + timeout / 3;
      step_ = Step::Python;
      return true;
    }
    notes_.push_back("cannot signal the Python hook: " + errnoText(errno));
    python_.reset();
  } else if (hook) {
    notes_.emplace_back(
        "no Python stacks: the process has not loaded dlrun's hook (not "
        "Python, or Python without site or PYTHONPATH)");
  }
  return false;
}

}  // namespace stack_dump_detail

using stack_dump_detail::errnoText;
namespace fs = std::filesystem;

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
# On signal )" +
         sig + R"(, faulthandler writes every thread's Python stack to py-<pid>.txt next to
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
        faulthandler.register()" +
         sig + R"(, file=dump, all_threads=True, chain=False)
        os.rename(path + ".part", path)
    except BaseException:
        faulthandler.unregister()" +
         sig + R"()
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

}  // namespace dlrun::agents
