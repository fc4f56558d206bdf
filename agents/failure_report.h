// The root-cause report dlrun prints when a worker group fails for good: which rank, how it
// ended (and the torch timer whose expiry made dlrun signal it), what it wrote to its error
// file, and the last lines of its stderr.
#pragma once

#include <deque>
#include <string>

#include "agents/process.h"

namespace dlrun::agents {

struct WorkerFailure {
  int rank = 0;
  int localRank = 0;
  std::string node;  // where it ran, in a multi-node job
  ExitStatus status;
  std::string errorMessage;            // from TORCHELASTIC_ERROR_FILE, if the worker wrote one
  std::deque<std::string> stderrTail;  // captured when stderr was piped
  std::string expiredTimer;            // a torch timer that made dlrun signal it (one line), if any
};

// The message in a TORCHELASTIC_ERROR_FILE, as PyTorch's @record writes it
// ({"message": {"message": ..., "extraInfo": {"py_callstack": ...}}}, or a plain string).
// Empty when the file is missing or unreadable.
std::string readErrorFile(const std::string& path);

// Multi-line text, each line starting with "dlrun: ".
std::string formatFailureReport(const WorkerFailure& failure, int restartsUsed);

}  // namespace dlrun::agents
