// Reading stack dumps: the native stacks eu-stack and gdb print, the Python stacks faulthandler
// prints, and the dump of PyTorch's NCCL flight recorder. Pure: stack_dump.h collects the
// texts, this says what they show (the frames that tell where a process is, the collective it
// waits in), and the tests feed it captured samples.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlrun::agents {

struct StackFrame {
  std::string function;  // as the tool prints it (demangled); empty where it found no symbol
  std::string file;      // Python frames: the source file
  int line = 0;          // Python frames: the line
};

struct StackThread {
  bool main = false;               // the process's main thread, as far as the text tells
  std::vector<StackFrame> frames;  // innermost first
};

// `eu-stack -p PID` output; the thread whose TID is `pid` is the main one.
std::vector<StackThread> parseEuStack(std::string_view text, pid_t pid);
// `gdb -batch -p PID -ex "thread apply all bt"` output; the thread whose LWP is `pid` is the
// main one.
std::vector<StackThread> parseGdbBacktrace(std::string_view text, pid_t pid);
// faulthandler's all-threads dump. The main thread is the one whose outermost frame is a
// module's top level (<module>), else the last one (faulthandler lists the newest first).
std::vector<StackThread> parseFaulthandler(std::string_view text);

// The collective a process waits in: torch's op name (all_reduce, barrier, ...) where a Python
// frame of torch.distributed names one, else the op a native frame names (gloo's algorithms,
// ProcessGroupGloo's work, NCCL's calls, dlrun-train's all-reduce), else a native frame that
// waits on a collective's work without naming it (c10d::Work::wait). Frames of threads that
// every gloo or NCCL process keeps waiting while idle (gloo's event loop, ProcessGroupGloo's
// work queue, NCCL's proxies) are not waits in a collective.
std::optional<std::string> findCollective(const std::vector<StackThread>& python,
                                          const std::vector<StackThread>& native);

// Where the process is: the main thread's innermost `count` named frames, from the Python
// stacks where there are any ("sleep_here (train.py:12)"), else from the native ones, without
// their parameter lists ("c10d::Work::wait").
std::vector<std::string> topFrames(const std::vector<StackThread>& python,
                                   const std::vector<StackThread>& native, size_t count = 5);

// The newest entry of a flight recorder dump (PyTorch pickles a dict whose "entries" each hold
// "profiling_name" = "nccl:all_reduce", a sequence number and a "state"): "all_reduce (seq 12,
// started)". nullopt when the dump holds no entry or is not such a pickle.
std::optional<std::string> lastFlightRecorderCollective(std::string_view dump);

}  // namespace dlrun::agents
