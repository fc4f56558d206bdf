#include "control/log_relay.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <grpcpp/support/sync_stream.h>

#include "common/clock.h"
#include "common/error.h"
#include "control/job_state.h"
#include "control/state/control_state.h"

namespace dlrun::control {

namespace {

// One agent asked: the chunks it answers with, in order.
struct Source {
  int64_t agent = 0;
  std::string node;
  int64_t next = 0;  // the number of its next chunk
  bool done = false;
  Clock::time_point heard = Clock::now();
  std::optional<LogChunk> first;
};

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

class Relay {
 public:
  Relay(LeasingStore& store, const JobRecord& job, const LogRequest& request,
        const LogTiming& timing, grpc::ServerContext& context,
        grpc::ServerWriter<v1::LogLine>& writer)
      : store_(store),
        job_(job),
        request_(request),
        timing_(timing),
        context_(context),
        writer_(writer),
        keys_(job.id) {}

  grpc::Status run() {
    findAgents();
    ask();
    hearFirst();
    chooseHolders();
    const grpc::Status status = request_.grouped ? sendGrouped() : stream();
    finish();
    return status;
  }

 private:
  // The agents that may answer: every one still running (not replaced on its host, not exited),
  // on the node asked if one was.
  void findAgents() {
    const std::vector<int64_t> replaced = replacedBy(job_.agents);
    for (size_t i = 0; i < job_.agents.size(); ++i) {
      const AgentRecord& agent = job_.agents[i];
      if (replaced[i] != 0 || !agent.state || agent.state->state == "exited") continue;
      if (!request_.node.empty() && agent.name != request_.node) continue;
      sources_.push_back({.agent = agent.id, .node = agent.name});
    }
    if (sources_.empty())
      refuse(grpc::StatusCode::FAILED_PRECONDITION,
             request_.node.empty()
                 ? "no agent of job '" + job_.id + "' is running to read its output"
                 : "no agent of job '" + job_.id + "' runs on node '" + request_.node + "'");
  }

  // The request, then the command every agent waits on (ctl/signal/M).
  void ask() {
    n_ = store_.add(keys_.count(), 1);
    store_.set(keys_.request(n_), encode(request_));
    const Keys ctl(job_.id);
    store_.set(ctl.signal(store_.add(ctl.signals(), 1)),
               encodeCommand({.kind = ControlCommand::Kind::Logs, .value = static_cast<int>(n_)}));
  }

  std::string chunkKey(const Source& s) const { return keys_.chunk(n_, s.agent, s.next); }

  // Each agent's first chunk says whether it holds what was asked; all answer at once, so one
  // deadline bounds them together.
  void hearFirst() {
    const auto deadline = Clock::now() + timing_.answer;
    for (auto& s : sources_) {
      const std::string key = chunkKey(s);
      while (!store_.waitFor({key}, timing_.poll)) {
        if (context_.IsCancelled() || Clock::now() >= deadline) break;
      }
      const std::string bytes = store_.peek({key})[0];
      if (bytes.empty()) {
        s.done = true;
        silent_.push_back(s.node);
        continue;
      }
      s.first = take(s, bytes);
    }
  }

  LogChunk take(Source& s, const std::string& bytes) {
    store_.deleteKey(chunkKey(s));
    ++s.next;
    s.heard = Clock::now();
    LogChunk chunk = decodeLogChunk(bytes);
    if (chunk.kind != LogChunk::Kind::Data) s.done = true;
    for (auto& line : chunk.lines) line.nodes = {s.node};
    return chunk;
  }

  // The agents that hold it; one rank's output from the newest attempt that holds it.
  void chooseHolders() {
    std::vector<std::string> errors;
    Source* newest = nullptr;
    for (auto& s : sources_) {
      if (!s.first) continue;
      const LogChunk::Kind kind = s.first->kind;
      if (kind == LogChunk::Kind::Error) errors.push_back(s.first->detail);
      if (kind != LogChunk::Kind::Data && kind != LogChunk::Kind::End) continue;
      holders_.push_back(&s);
      if (!newest || s.first->attempt > newest->first->attempt) newest = &s;
    }
    if (request_.rank >= 0 && newest) holders_ = {newest};
    if (!holders_.empty()) return;
    finish();
    if (!errors.empty()) refuse(grpc::StatusCode::FAILED_PRECONDITION, errors.front());
    std::string what =
        request_.rank >= 0 ? "rank " + std::to_string(request_.rank) + "'s output" : "output";
    if (request_.attempt >= 0) what += " of attempt " + std::to_string(request_.attempt);
    refuse(grpc::StatusCode::FAILED_PRECONDITION,
           "no agent of job '" + job_.id + "' holds " + what +
               (request_.node.empty() ? "" : " on node '" + request_.node + "'") +
               (silent_.empty() ? "" : " (no answer from " + joined(silent_) + ")"));
  }

  bool send(const LogChunk& chunk) {
    for (const auto& line : chunk.lines)
      if (!writer_.Write(toProto(line, chunk.attempt))) return false;
    return true;
  }

  static v1::LogLine toProto(const LogLine& line, int attempt) {
    v1::LogLine out;
    out.set_text(line.text);
    for (int rank : line.ranks) out.add_ranks(rank);
    for (const auto& node : line.nodes) out.add_nodes(node);
    out.set_stderr(line.err);
    out.set_attempt(attempt);
    out.set_count(line.count);
    return out;
  }

  // Waits for the holders' next chunks, taking each as it comes: false when the call was
  // cancelled. `onChunk` gets every chunk, the first ones included.
  template <typename OnChunk>
  bool follow(OnChunk&& onChunk) {
    for (auto* s : holders_)
      if (!onChunk(*s, *s->first)) return false;
    for (;;) {
      std::vector<Source*> active;
      std::vector<std::string> keys;
      for (auto* s : holders_) {
        if (s->done) continue;
        active.push_back(s);
        keys.push_back(chunkKey(*s));
      }
      if (active.empty()) return true;
      if (context_.IsCancelled()) return false;
      const std::vector<std::string> found = store_.peek(keys);
      bool got = false;
      for (size_t i = 0; i < active.size(); ++i) {
        if (found[i].empty()) continue;
        got = true;
        if (!onChunk(*active[i], take(*active[i], found[i]))) return false;
      }
      if (got) continue;
      for (auto* s : active) {
        if (Clock::now() - s->heard < timing_.silence) continue;
        s->done = true;
        gone_.push_back(s->node);
      }
      store_.waitFor({keys.front()}, timing_.poll);
    }
  }

  grpc::Status stream() {
    if (!follow([&](const Source&, const LogChunk& chunk) { return send(chunk); }))
      return grpc::Status::CANCELLED;
    return ended();
  }

  // Every holder's lines (each node's already merged), merged across nodes.
  grpc::Status sendGrouped() {
    std::vector<std::vector<LogLine>> nodes(holders_.size());
    std::map<int64_t, size_t> index;
    for (size_t i = 0; i < holders_.size(); ++i) index[holders_[i]->agent] = i;
    int attempt = -1;
    const bool whole = follow([&](const Source& s, const LogChunk& chunk) {
      attempt = std::max(attempt, chunk.attempt);
      auto& into = nodes[index.at(s.agent)];
      into.insert(into.end(), chunk.lines.begin(), chunk.lines.end());
      return true;
    });
    if (!whole) return grpc::Status::CANCELLED;
    for (const auto& line : mergeLines(nodes))
      if (!writer_.Write(toProto(line, attempt))) return grpc::Status::CANCELLED;
    return ended();
  }

  grpc::Status ended() const {
    if (gone_.empty()) return grpc::Status::OK;
    return {grpc::StatusCode::UNAVAILABLE,
            "the agent on " + joined(gone_) + " stopped answering (its node may be lost)"};
  }

  // The request goes, so the agents stop answering; what they wrote that nobody took is removed
  // (here for an agent that may have stopped; by the agent itself for a chunk written while the
  // request went).
  void finish() {
    if (finished_) return;
    finished_ = true;
    store_.deleteKey(keys_.request(n_));
    for (auto& s : sources_) {
      if (s.done) continue;
      std::vector<std::string> left;
      for (int64_t k = s.next; k <= s.next + kLogChunksAhead; ++k)
        left.push_back(keys_.chunk(n_, s.agent, k));
      store_.deleteKeys(left);
    }
  }

  LeasingStore& store_;
  const JobRecord& job_;
  const LogRequest& request_;
  const LogTiming& timing_;
  grpc::ServerContext& context_;
  grpc::ServerWriter<v1::LogLine>& writer_;
  const LogKeys keys_;
  int64_t n_ = 0;
  std::vector<Source> sources_;
  std::vector<Source*> holders_;
  std::vector<std::string> silent_;  // asked, never answered
  std::vector<std::string> gone_;    // answered, then fell silent
  bool finished_ = false;
};

}  // namespace

LogRequest toLogRequest(const v1::LogsRequest& r) {
  LogRequest out{.rank = r.has_rank() ? r.rank().value() : -1,
                 .node = r.node(),
                 .attempt = r.has_attempt() ? r.attempt().value() : -1,
                 .follow = r.follow(),
                 .tail = r.has_tail() ? r.tail().value() : -1,
                 .grep = r.grep(),
                 .grouped = r.grouped()};
  if (r.streams() == "out") {
    out.streams = LogStreams::Out;
  } else if (r.streams() == "err") {
    out.streams = LogStreams::Err;
  } else if (!r.streams().empty() && r.streams() != "both") {
    refuse(grpc::StatusCode::INVALID_ARGUMENT,
           "streams '" + r.streams() + "': say out, err or both");
  }
  if (r.has_rank() && out.rank < 0)
    refuse(grpc::StatusCode::INVALID_ARGUMENT, "rank " + std::to_string(out.rank) + " < 0");
  if (r.has_attempt() && out.attempt < 0)
    refuse(grpc::StatusCode::INVALID_ARGUMENT, "attempt " + std::to_string(out.attempt) + " < 0");
  if (r.has_tail() && out.tail < 0)
    refuse(grpc::StatusCode::INVALID_ARGUMENT, "tail " + std::to_string(out.tail) + " < 0");
  if (r.grouped() && r.follow())
    refuse(grpc::StatusCode::INVALID_ARGUMENT,
           "the job-wide view (grouped) is of the output so far: it cannot follow");
  return out;
}

grpc::Status relayLogs(LeasingStore& store, const JobRecord& job, const LogRequest& request,
                       const LogTiming& timing, grpc::ServerContext& context,
                       grpc::ServerWriter<v1::LogLine>& writer) {
  return Relay(store, job, request, timing, context, writer).run();
}

}  // namespace dlrun::control
