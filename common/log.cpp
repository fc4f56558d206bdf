#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

namespace dlrun::log {
namespace {

std::string& programName() {
  static std::string name = "dlrun";
  return name;
}

std::atomic<bool>& verboseFlag() {
  static std::atomic<bool> flag = [] {
    const char* level = std::getenv("DLRUN_LOG_LEVEL");
    return level != nullptr && std::strcmp(level, "debug") == 0;
  }();
  return flag;
}

std::function<void(std::string_view)>& threadSink() {
  thread_local std::function<void(std::string_view)> sink;
  return sink;
}

void emit(std::string_view level, std::string_view message) {
  if (auto& sink = threadSink()) {
    std::string line(level);
    line += message;
    return sink(line);
  }
  std::string line = programName();
  line += ": ";
  line += level;
  line += message;
  line += '\n';
  // A single write keeps concurrent lines whole; a failed write to stderr has nowhere to go.
  [[maybe_unused]] auto ignored = ::write(STDERR_FILENO, line.data(), line.size());
}

}  // namespace

void setThreadSink(std::function<void(std::string_view)> sink) { threadSink() = std::move(sink); }
void setProgramName(std::string_view name) { programName() = std::string(name); }
void setVerbose(bool verbose) { verboseFlag() = verbose; }
bool verbose() { return verboseFlag(); }

void info(std::string_view message) { emit("", message); }
void warn(std::string_view message) { emit("warning: ", message); }
void debug(std::string_view message) {
  if (verbose()) emit("debug: ", message);
}

}  // namespace dlrun::log
