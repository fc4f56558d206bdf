// Worker output: each captured stream is read as it arrives, cut into lines, shown on the
// console with a rank prefix (one write per line, so ranks never interleave mid-line), copied
// raw to the rank's log file, and its last lines kept for the failure report.
#pragma once

#include <algorithm>
#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace boost::asio {
class io_context;
}

namespace dlrun::agents {

class ConsoleDedup;

// What ends a console line that was cut from a longer one (LineSplitter's limit, 64 KiB).
inline constexpr std::string_view kCutMark = " [dlrun: line cut at 64 KiB, it goes on below]";

// Cuts a byte stream into lines; a line longer than the limit is passed on in pieces.
class LineSplitter {
 public:
  explicit LineSplitter(size_t maxLine = 64 * 1024) : maxLine_(maxLine) {}
  // Calls emit(line) for each complete line (without its '\n').
  template <typename Emit>
  void feed(std::string_view bytes, Emit&& emit);
  // The unterminated rest, if any, as a last line.
  template <typename Emit>
  void finish(Emit&& emit);
  // While emit() runs: the line it got is a piece of a longer one, and more of it follows.
  bool continues() const { return continues_; }

 private:
  size_t maxLine_;
  std::string partial_;
  bool cut_ = false;  // the last thing emitted was a piece of a longer line
  bool continues_ = false;
};

// Writes all of `bytes` to `fd`, retrying short writes; a closed console or a full disk ends it
// quietly (output is best effort).
void writeAll(int fd, std::string_view bytes);

// Expands ${rank}, ${local_rank} and ${role_name} in a prefix template, as torch does
// (substituteTemplate: `$$` is `$`, other names stay as written).
std::string expandPrefix(const std::string& pattern, int rank, int localRank,
                         const std::string& role);

// `line` (without its '\n') as torchrun shows a teed stream, which it reads back from the log
// file in Python's text mode: "\r\n" is one line end and a lone '\r' a line end of its own,
// so a last '\r' is dropped (and, at the end of the stream, sets `ended`), and the others become
// '\n'; each ill-formed UTF-8 sequence becomes U+FFFD, as Python's "replace" decoding gives.
std::string asPythonText(std::string_view line, bool& ended);

// torchrun's --duplicate-stdout-filters/--duplicate-stderr-filters: the console lines of the
// node's workers that hold any of the needles (case-sensitive substrings), copied with their
// prefix to one file of the attempt (filtered_stdout.log, filtered_stderr.log). Written from
// the io_context's thread alone, a line at a time.
class FilteredLog {
 public:
  // Creates (truncates) the file; throws Error naming it when that fails.
  FilteredLog(const std::filesystem::path& file, std::vector<std::string> needles);
  ~FilteredLog();
  FilteredLog(const FilteredLog&) = delete;
  FilteredLog& operator=(const FilteredLog&) = delete;

  // `line` without its newline; `ended`: it had one (torchrun copies a last line as it is).
  void offer(std::string_view prefix, std::string_view line, bool ended = true);

 private:
  int fd_;
  std::vector<std::string> needles_;
};

struct OutputTarget {
  int consoleFd = -1;       // STDOUT_FILENO or STDERR_FILENO; -1 hides the stream from the console
  std::string prefix;       // prepended to each console line
  bool exactBytes = false;  // an unterminated last line stays unterminated on the console
  bool pythonText = false;  // console lines as asPythonText gives them (torchrun's teed streams)
  int fileFd = -1;          // log file receiving the raw bytes; -1 for none (the pump owns it)
  size_t keepLines = 0;
  std::shared_ptr<FilteredLog> filtered;  // console lines matching its needles, copied there
  // Console lines go through it, with `rank`, instead of straight to consoleFd (its prefix is
  // then the ranks', "[0-7]:")
  std::shared_ptr<ConsoleDedup> dedup;
  int rank = -1;
};

class StreamPump {
 public:
  // Takes ownership of `fd` (non-blocking) and of target.fileFd.
  StreamPump(boost::asio::io_context& io, int fd, OutputTarget target);
  ~StreamPump();
  StreamPump(const StreamPump&) = delete;
  StreamPump& operator=(const StreamPump&) = delete;

  void start();
  // Reads what is already in the pipe, emits the unterminated rest, stops reading and closes.
  // Called when the worker has been reaped: its children may keep the pipe open forever.
  void drain();
  const std::deque<std::string>& lastLines() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

template <typename Emit>
void LineSplitter::feed(std::string_view bytes, Emit&& emit) {
  while (!bytes.empty()) {
    const size_t newline = bytes.find('\n');
    const size_t lineEnd = newline == std::string_view::npos ? bytes.size() : newline;
    const size_t take = std::min(lineEnd, maxLine_ - partial_.size());
    partial_.append(bytes.substr(0, take));
    bytes.remove_prefix(take);
    if (partial_.size() == maxLine_) {  // a piece of a long line
      continues_ = true;
      emit(std::string_view(partial_));
      continues_ = false;
      partial_.clear();
      cut_ = true;
      continue;
    }
    if (take == lineEnd && newline != std::string_view::npos) {
      // The newline right after a piece ends that long line: it is not an empty line of its own.
      if (!partial_.empty() || !cut_) emit(std::string_view(partial_));
      partial_.clear();
      cut_ = false;
      bytes.remove_prefix(1);
    }
  }
}

template <typename Emit>
void LineSplitter::finish(Emit&& emit) {
  if (!partial_.empty()) emit(std::string_view(partial_));
  partial_.clear();
  cut_ = false;
}

}  // namespace dlrun::agents
