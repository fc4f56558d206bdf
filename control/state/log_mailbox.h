// `dlrun logs` through the control plane (docs/design/control.md, "Logs"): the Control service
// asks a job's agents, through its store, for a rank's or a node's output, and each agent answers
// from the log tree on its own disk. Pure: the keys, the codecs, and the merge of identical lines
// that the job-wide view shows once with every rank and node that printed them.
//
// Keys under "dlrun/ID/ctl/" (control_state.h's), beside the commands:
//   logs            the number of requests so far (ADD); request N is at log/N
//   log/N           the request (LogRequest), written before the command `logs:N` goes to every
//                   agent as ctl/signal/M (the channel agents already wait on), and deleted once
//                   the service is done with it (its caller went away or has all it asked for):
//                   an agent that finds it gone stops answering and removes what it wrote
//   log/N/I/K       agent I's K-th answer (LogChunk), deleted by the service once passed on; an
//                   agent writes K only once K - kLogChunksAhead is gone, so an answer nobody reads
//                   holds at most that many chunks in the store
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dlrun::control {

class LogKeys {
 public:
  explicit LogKeys(const std::string& runId) : ctl_("dlrun/" + runId + "/ctl/") {}
  std::string count() const { return ctl_ + "logs"; }
  std::string request(int64_t n) const { return ctl_ + "log/" + std::to_string(n); }
  std::string chunk(int64_t n, int64_t agent, int64_t k) const {
    return request(n) + "/" + std::to_string(agent) + "/" + std::to_string(k);
  }

 private:
  std::string ctl_;
};

// Chunks an agent may have written that the service has not taken yet.
inline constexpr int64_t kLogChunksAhead = 4;
// A chunk's lines stop growing past this many bytes (a line longer than it goes alone).
inline constexpr size_t kLogChunkBytes = 256 * 1024;

enum class LogStreams { Both, Out, Err };

struct LogRequest {
  int rank = -1;     // -1: every rank of the node(s) asked
  std::string node;  // a host's name: only its agents answer; empty: every agent
  int attempt = -1;  // the attempt_N folder; -1: the newest that holds what is asked
  LogStreams streams = LogStreams::Both;
  bool follow = false;   // keep sending what the files gain until cancelled
  int64_t tail = -1;     // only the last lines of each stream (-1: all)
  std::string grep;      // only the lines that contain it (empty: all)
  bool grouped = false;  // each node's identical lines once, with their ranks (the job-wide view)
};

// A line of output: one rank's, or (grouped) the same text from every rank in `ranks`.
struct LogLine {
  std::string text;  // the bytes as the worker wrote them, without the newline
  std::vector<int> ranks;
  std::vector<std::string> nodes;  // where they ran (filled in by the service)
  bool err = false;                // from stderr
  int64_t count = 1;               // how many times in all (grouped: at least ranks.size())
};

struct LogChunk {
  enum class Kind {
    Data,    // lines (none: a heartbeat of a follow that had nothing new)
    End,     // the last chunk: everything asked for was sent
    Absent,  // this agent holds nothing that was asked: its only chunk
    Error,   // it holds it but cannot send it (detail says why): its only chunk
  };
  Kind kind = Kind::Data;
  int attempt = -1;  // the attempt the lines are from
  std::string detail;
  std::vector<LogLine> lines;
};

std::string encode(const LogRequest& request);
// Throws ProtocolError for text that is not a request.
LogRequest decodeLogRequest(std::string_view text);
// Binary-safe: a line's bytes go as they are (a worker may print anything).
std::string encode(const LogChunk& chunk);
// Throws ProtocolError for bytes that are not a chunk.
LogChunk decodeLogChunk(std::string_view bytes);

// Merges sources (a rank's lines, or a node's already merged ones) into one sequence in which
// each text is shown once per occurrence: the k-th time a source holds a text joins the k-th
// line of that text, whose ranks, nodes and count are the union of its members'. Lines come in
// the order of their first member, taking the sources' lines position by position (the first
// line of every source, then the second, ...): each source's own order is kept where the sources
// agree on it (ranks that print the same lines in the same order, what the view is for).
std::vector<LogLine> mergeLines(const std::vector<std::vector<LogLine>>& sources);

}  // namespace dlrun::control
