// Stack reports of hung workers: every worker's native stacks (eu-stack, else gdb), its Python
// stacks (faulthandler, through a hook dlrun installs in Python workers) and, where PyTorch's
// NCCL flight recorder listens on its pipe, its last collectives, written to one file per rank.
// The hang watchdog runs dumpStacks; stack_text.h reads what the tools print.
//
// The Python hook is a sitecustomize.py in a directory the agent puts first on the workers'
// PYTHONPATH. Each Python process that imports it registers faulthandler on a real-time signal
// and opens DIR/py-<pid>.txt for the dumps. dumpStacks sends that signal only to a process that
// holds its own file open: one without the hook (not Python, `python -I`, a program it exec'd)
// would die of it. The hook then runs the next sitecustomize on sys.path, so a site's or a
// virtualenv's own keeps working.
//
// Permissions: eu-stack and gdb attach with ptrace, which Yama's ptrace_scope=1 (common on
// desktops and clouds) grants only to ancestors; workers declare the agent their ptracer
// (process.h), so the tools the agent starts may attach. Under ptrace_scope=2 or 3, or across
// users, the native part fails with the tool's reason and the Python part still works.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "agents/worker_env.h"

namespace dlrun::agents {

class PythonStackHook {
 public:
  // Writes DIR/sitecustomize.py, creating DIR. DIR must be on this node and this job's own:
  // the hook's files are named by pid. Throws Error naming the file when it cannot be written.
  explicit PythonStackHook(std::filesystem::path dir);

  // The variables the workers need (RoundSpec::services): PYTHONPATH with DIR first, then the
  // PYTHONPATH the workers would have inherited.
  Environment environment(const Environment& inherited) const;

  const std::filesystem::path& dir() const { return dir_; }

  // The signal the hook answers: a real-time one (queued, never merged), not SIGUSR1 or
  // SIGUSR2, which the agent forwards to workers for their own use.
  static int signal();
  // sitecustomize.py's text.
  static std::string source(int signal);

 private:
  std::filesystem::path dir_;
};

struct StackTarget {
  pid_t pid = -1;  // a worker (a child of the caller, or at least a process it may signal)
  int rank = -1;   // its global RANK: it names torch's flight recorder pipe and dump
  std::filesystem::path outFile;
  // False: its Python stack alone where the hook answers (a debugger stops every thread of a
  // process while it walks it: a worker that recovers in process meanwhile would wait).
  bool native = true;
};

struct StackDump {
  pid_t pid = -1;
  int rank = -1;
  std::string text;                       // what was written to the target's outFile
  std::vector<std::string> topFrames;     // where it is (stack_text.h's topFrames)
  std::optional<std::string> collective;  // the collective it waits in (findCollective)
  // The flight recorder's dump, copied next to outFile (outFile + ".nccl_trace"), and its
  // newest entry: "all_reduce (seq 12, started)".
  std::optional<std::filesystem::path> ncclTrace;
  std::optional<std::string> lastNcclCollective;
  // Why no stack at all could be taken, or why outFile could not be written (text holds the
  // report all the same); empty when neither happened.
  std::string error;
};

// Takes the stacks of every target at once and writes each target's outFile, in the order of
// `targets`. For each: the Python stacks first (the hook's signal, when the process has the
// hook), then the native ones (eu-stack, else gdb; gdb also where eu-stack shows no frame), and
// meanwhile the flight recorder (where the worker's TORCH_NCCL_DEBUG_INFO_PIPE_FILE names a
// pipe torch listens on). Everything ends by `timeout`: a tool still running then is killed,
// and a worker it leaves stopped is continued. Nothing throws: each StackDump's error and its
// report's notes say what failed.
//
// Blocks for up to `timeout` (it waits on the tools and on the workers' dump files): the caller
// runs it on a thread of its own. It starts the tools as its children; when the caller reaps
// every child (the agent's waitpid(-1)), a tool's exit status may be lost, never its output.
// `hook` may be null: then no process is signalled.
std::vector<StackDump> dumpStacks(const std::vector<StackTarget>& targets,
                                  const PythonStackHook* hook, std::chrono::milliseconds timeout);

}  // namespace dlrun::agents
