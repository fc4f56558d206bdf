// One-line diagnostics on stderr, each prefixed with the program's name ("dlrund: ...").
// Thread-safe: a line is written with a single write(2) so lines from threads never interleave.
#pragma once

#include <functional>
#include <string_view>

namespace dlrun::log {

// Set once at the start of main; defaults to "dlrun".
void setProgramName(std::string_view name);

// Messages at Debug level are dropped unless enabled (DLRUN_LOG_LEVEL=debug or setVerbose).
void setVerbose(bool verbose);
bool verbose();

// Where this thread's lines go instead of stderr (each whole, without its newline); empty:
// stderr again. The rendezvous simulation keeps them in a schedule's trace.
void setThreadSink(std::function<void(std::string_view line)> sink);

void info(std::string_view message);
void warn(std::string_view message);
void debug(std::string_view message);

}  // namespace dlrun::log
