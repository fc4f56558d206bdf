#include "agents/log_server.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <list>
#include <optional>

#include "agents/output.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"

namespace dlrun::agents {

namespace fs = std::filesystem;
using control::LogChunk;
using control::LogLine;
using control::LogRequest;
using control::LogStreams;

namespace {

constexpr auto kIdle = std::chrono::milliseconds(200);  // a follow's look at its files
constexpr auto kHeartbeat = std::chrono::seconds(5);    // an empty chunk says "still here"
constexpr size_t kReadBytes = 64 * 1024;                // from one file at a time
constexpr int64_t kGroupedTail = 1000;  // the job-wide view's lines a stream, unless told

// One stream of one rank, read from where the last read ended.
struct FileReader {
  int rank = 0;
  bool err = false;
  int fd = -1;
  int64_t offset = 0;
  LineSplitter splitter;
  bool atEnd = false;  // (not following) read to its end

  FileReader(int rank, bool err, int fd) : rank(rank), err(err), fd(fd) {}
  FileReader(FileReader&& other) noexcept
      : rank(other.rank),
        err(other.err),
        fd(std::exchange(other.fd, -1)),
        offset(other.offset),
        splitter(std::move(other.splitter)),
        atEnd(other.atEnd) {}
  ~FileReader() {
    if (fd >= 0) ::close(fd);
  }

  // Reads up to kReadBytes and hands over each whole line that holds `grep`; the rest of an
  // unterminated line once the file ended, unless `follow` (it may be finished later).
  template <typename Take>
  bool read(const std::string& grep, bool follow, Take&& take) {
    char buffer[kReadBytes];
    const ssize_t got = ::pread(fd, buffer, sizeof buffer, offset);
    auto emit = [&](std::string_view line) {
      if (grep.empty() || line.find(grep) != std::string_view::npos)
        take(LogLine{.text = std::string(line), .ranks = {rank}, .err = err});
    };
    if (got <= 0) {
      if (!follow) {
        splitter.finish(emit);
        atEnd = true;
      }
      return false;
    }
    offset += got;
    splitter.feed(std::string_view(buffer, static_cast<size_t>(got)), emit);
    return true;
  }
};

size_t bytesOf(const LogLine& line) { return line.text.size() + 16; }

}  // namespace

struct LogServer::Serving {
  int64_t n = 0;
  int64_t agent = 0;
  LogRequest request;
  bool begun = false;
  int attempt = -1;
  std::vector<FileReader> readers;
  size_t nextReader = 0;
  std::deque<LogLine> pending;
  size_t pendingBytes = 0;
  int64_t chunk = 0;  // the number of the next chunk
  Clock::time_point lastWrite = Clock::now();
  std::optional<LogChunk> only;  // an answer of one chunk (Absent, Error), sent by the next step

  void add(LogLine line) {
    pendingBytes += bytesOf(line);
    pending.push_back(std::move(line));
  }
  bool readersDone() const {
    return std::all_of(readers.begin(), readers.end(), [](const auto& r) { return r.atEnd; });
  }
};

LogServer::LogServer(std::string runId, std::string nodeName,
                     std::function<std::unique_ptr<LeasingStore>()> connect)
    : nodeName_(std::move(nodeName)), keys_(runId), connect_(std::move(connect)) {}

LogServer::~LogServer() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void LogServer::attempt(AttemptFiles files) {
  std::lock_guard lock(mutex_);
  attempts_.push_back(std::move(files));
}

void LogServer::serve(int64_t n, int64_t agent) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    asked_.emplace_back(n, agent);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }
  changed_.notify_all();
}

void LogServer::run() {
  // An observer's thread: where CPUs are short the job goes first (as the publisher's).
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), 10);
  std::unique_ptr<LeasingStore> store;
  std::list<Serving> serving;
  bool busy = false;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      const auto ready = [&] { return stopping_ || !asked_.empty(); };
      if (serving.empty()) {
        changed_.wait(lock, ready);
      } else if (!busy) {
        changed_.wait_for(lock, kIdle, ready);
      }
      if (stopping_) break;
      for (const auto& [n, agent] : asked_) serving.push_back({.n = n, .agent = agent});
      asked_.clear();
    }
    try {
      if (!store) store = connect_();
      busy = false;
      for (auto it = serving.begin(); it != serving.end();) {
        const int64_t before = it->chunk;
        const bool goesOn = step(*store, *it);
        busy = busy || it->chunk != before;
        it = goesOn ? std::next(it) : serving.erase(it);
      }
    } catch (const std::exception& e) {
      // The service gives up on an agent that stopped answering: drop what was asked.
      log::debug(std::string("dlrun logs: cannot answer through the store: ") + e.what());
      store.reset();
      serving.clear();
    }
  }
  for (auto& s : serving) {
    if (!store || !s.begun) continue;
    try {
      store->set(keys_.chunk(s.n, s.agent, s.chunk),
                 control::encode(LogChunk{.kind = LogChunk::Kind::End,
                                          .attempt = s.attempt,
                                          .detail = "the agent on " + nodeName_ + " stopped"}));
    } catch (const std::exception&) {
      return;  // the store is gone with the job
    }
  }
}

// What this node holds of the request: the attempt and a reader a file, or the one chunk that
// says it holds nothing (or cannot send it).
void LogServer::begin(LeasingStore& store, Serving& s) {
  s.begun = true;
  try {
    s.request = control::decodeLogRequest(store.peek({keys_.request(s.n)})[0]);
  } catch (const ProtocolError& e) {
    s.only = LogChunk{.kind = LogChunk::Kind::Error, .detail = e.what()};
    return;
  }
  const LogRequest& r = s.request;
  std::vector<AttemptFiles> attempts;
  {
    std::lock_guard lock(mutex_);
    attempts = attempts_;
  }
  const AttemptFiles* chosen = nullptr;
  for (const auto& a : attempts) {
    const bool holds = r.rank < 0 || (r.rank >= a.baseRank && r.rank < a.baseRank + a.workers);
    if (holds && (r.attempt < 0 || r.attempt == a.attempt) &&
        (!chosen || a.attempt > chosen->attempt))
      chosen = &a;
  }
  if (!chosen || (!r.node.empty() && r.node != nodeName_)) {
    s.only = LogChunk{.kind = LogChunk::Kind::Absent};
    return;
  }
  s.attempt = chosen->attempt;
  const int first = r.rank < 0 ? chosen->baseRank : r.rank;
  const int last = r.rank < 0 ? chosen->baseRank + chosen->workers - 1 : r.rank;
  for (int rank = first; rank <= last; ++rank) {
    for (const bool err : {false, true}) {
      if (r.streams == (err ? LogStreams::Out : LogStreams::Err)) continue;
      const fs::path file = chosen->dir / std::to_string(rank - chosen->baseRank) /
                            (err ? "stderr.log" : "stdout.log");
      const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) s.readers.emplace_back(rank, err, fd);
    }
  }
  if (s.readers.empty()) {
    const std::string what = r.rank < 0 ? "its ranks'" : "rank " + std::to_string(r.rank) + "'s";
    s.only = LogChunk{.kind = LogChunk::Kind::Error,
                      .attempt = s.attempt,
                      .detail = nodeName_ + " keeps none of " + what + " output of attempt " +
                                std::to_string(s.attempt) +
                                " in files: start the job with --tee=3 (or --redirects=3)"};
    return;
  }
  const int64_t tail = r.grouped && r.tail < 0 ? kGroupedTail : r.tail;
  if (tail < 0) return;
  // The last lines: each stream read to its end now, keeping only its tail.
  std::vector<std::vector<LogLine>> sources;
  for (auto& reader : s.readers) {
    std::deque<LogLine> kept;
    auto keep = [&](LogLine line) {
      kept.push_back(std::move(line));
      if (static_cast<int64_t>(kept.size()) > tail) kept.pop_front();
    };
    while (reader.read(r.grep, r.follow, keep)) {
    }
    sources.emplace_back(std::make_move_iterator(kept.begin()),
                         std::make_move_iterator(kept.end()));
  }
  if (r.grouped) {
    // The ranks' stdout lines, then their stderr lines: without the times they were written,
    // mixing the two streams line by line would be a guess.
    for (const bool err : {false, true}) {
      std::vector<std::vector<LogLine>> stream;
      for (size_t i = 0; i < sources.size(); ++i)
        if (s.readers[i].err == err) stream.push_back(std::move(sources[i]));
      for (auto& line : control::mergeLines(stream)) s.add(std::move(line));
    }
    for (auto& reader : s.readers) reader.atEnd = true;  // the view is of what is there now
    return;
  }
  for (auto& source : sources)
    for (auto& line : source) s.add(std::move(line));
}

bool LogServer::step(LeasingStore& store, Serving& s) {
  const std::string request = keys_.request(s.n);
  const bool pressed = s.chunk >= control::kLogChunksAhead;
  const auto seen = store.peek(
      pressed ? std::vector{request, keys_.chunk(s.n, s.agent, s.chunk - control::kLogChunksAhead)}
              : std::vector{request});
  if (seen[0].empty()) {  // the service is done with it: what it did not take goes too
    std::vector<std::string> left;
    for (int64_t k = std::max<int64_t>(0, s.chunk - control::kLogChunksAhead); k < s.chunk; ++k)
      left.push_back(keys_.chunk(s.n, s.agent, k));
    if (!left.empty()) store.deleteKeys(left);
    return false;
  }
  if (pressed && !seen[1].empty()) return true;  // not taken yet: wait for the reader
  if (!s.begun) begin(store, s);
  if (s.only) {
    s.only->attempt = s.attempt;
    store.set(keys_.chunk(s.n, s.agent, s.chunk++), control::encode(*s.only));
    return false;
  }
  // Fill up to a chunk, each reader once (a follow's files may have nothing new).
  for (size_t tries = 0; tries < s.readers.size() && s.pendingBytes < control::kLogChunkBytes;
       ++tries) {
    FileReader& reader = s.readers[s.nextReader];
    const bool more = !reader.atEnd && reader.read(s.request.grep, s.request.follow,
                                                   [&](LogLine line) { s.add(std::move(line)); });
    // Not following, a file is read to its end before the next (one rank's lines together).
    if (!more || s.request.follow) s.nextReader = (s.nextReader + 1) % s.readers.size();
    if (more && !s.request.follow) tries = 0;
  }
  LogChunk chunk{.kind = LogChunk::Kind::Data, .attempt = s.attempt};
  size_t bytes = 0;
  while (!s.pending.empty() &&
         (chunk.lines.empty() || bytes + bytesOf(s.pending.front()) <= control::kLogChunkBytes)) {
    bytes += bytesOf(s.pending.front());
    s.pendingBytes -= bytesOf(s.pending.front());
    chunk.lines.push_back(std::move(s.pending.front()));
    s.pending.pop_front();
  }
  const bool over = !s.request.follow && s.pending.empty() && s.readersDone();
  if (over) chunk.kind = LogChunk::Kind::End;
  if (chunk.lines.empty() && !over && Clock::now() - s.lastWrite < kHeartbeat) return true;
  store.set(keys_.chunk(s.n, s.agent, s.chunk++), control::encode(chunk));
  s.lastWrite = Clock::now();
  return !over;
}

}  // namespace dlrun::agents
