#include "control/state/log_mailbox.h"

#include <algorithm>
#include <map>
#include <tuple>

#include "common/error.h"
#include "common/text.h"
#include "store/json_fields.h"

namespace dlrun::control {

using json_fields::field;
using json_fields::json;
using json_fields::parse;

namespace {

const char* streamsName(LogStreams streams) {
  switch (streams) {
    case LogStreams::Out: return "out";
    case LogStreams::Err: return "err";
    case LogStreams::Both: break;
  }
  return "both";
}

// Netstrings ("5:bytes,"): each field's length goes first, so any byte may be in it.
void put(std::string& out, std::string_view field) {
  out += std::to_string(field.size());
  out += ':';
  out += field;
  out += ',';
}

class Reader {
 public:
  explicit Reader(std::string_view bytes) : rest_(bytes) {}
  bool done() const { return rest_.empty(); }
  std::string_view next() {
    const size_t colon = rest_.find(':');
    const auto size = colon == std::string_view::npos
                          ? std::nullopt
                          : parseInteger<size_t>(rest_.substr(0, colon));
    // The field and its ',' must fit in what is left after the ':'.
    if (!size || *size >= rest_.size() - colon - 1 || rest_[colon + 1 + *size] != ',')
      throw ProtocolError("malformed log chunk in the store");
    const std::string_view field = rest_.substr(colon + 1, *size);
    rest_.remove_prefix(colon + 2 + *size);
    return field;
  }
  template <typename T>
  T integer() {
    const auto value = parseInteger<T>(next());
    if (!value) throw ProtocolError("malformed number in a log chunk in the store");
    return *value;
  }

 private:
  std::string_view rest_;
};

std::string joined(const std::vector<std::string>& parts, char separator) {
  std::string out;
  for (const auto& part : parts) {
    if (!out.empty()) out += separator;
    out += part;
  }
  return out;
}

}  // namespace

std::string encode(const LogRequest& r) {
  return json{{"rank", r.rank},       {"node", r.node},
              {"attempt", r.attempt}, {"streams", streamsName(r.streams)},
              {"follow", r.follow},   {"tail", r.tail},
              {"grep", r.grep},       {"grouped", r.grouped}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

LogRequest decodeLogRequest(std::string_view text) {
  static constexpr const char* what = "log request";
  const json j = parse(text, what);
  const auto streams = field<std::string>(j, "streams", what);
  if (streams != "out" && streams != "err" && streams != "both")
    throw ProtocolError("log request has a malformed 'streams'");
  return {.rank = field<int>(j, "rank", what),
          .node = field<std::string>(j, "node", what),
          .attempt = field<int>(j, "attempt", what),
          .streams = streams == "out"   ? LogStreams::Out
                     : streams == "err" ? LogStreams::Err
                                        : LogStreams::Both,
          .follow = field<bool>(j, "follow", what),
          .tail = field<int64_t>(j, "tail", what),
          .grep = field<std::string>(j, "grep", what),
          .grouped = field<bool>(j, "grouped", what)};
}

std::string encode(const LogChunk& chunk) {
  std::string out = "dlrun-log,";
  put(out, std::to_string(static_cast<int>(chunk.kind)));
  put(out, std::to_string(chunk.attempt));
  put(out, chunk.detail);
  put(out, std::to_string(chunk.lines.size()));  // so that a chunk cut short is no chunk
  for (const auto& line : chunk.lines) {
    std::vector<std::string> ranks;
    for (int rank : line.ranks) ranks.push_back(std::to_string(rank));
    put(out, line.err ? "e" : "o");
    put(out, std::to_string(line.count));
    put(out, joined(ranks, ','));
    put(out, joined(line.nodes, '\n'));
    put(out, line.text);
  }
  return out;
}

LogChunk decodeLogChunk(std::string_view bytes) {
  if (!bytes.starts_with("dlrun-log,")) throw ProtocolError("malformed log chunk in the store");
  Reader in(bytes.substr(10));
  LogChunk chunk;
  const int kind = in.integer<int>();
  if (kind < 0 || kind > static_cast<int>(LogChunk::Kind::Error))
    throw ProtocolError("log chunk of an unknown kind in the store");
  chunk.kind = static_cast<LogChunk::Kind>(kind);
  chunk.attempt = in.integer<int>();
  chunk.detail = std::string(in.next());
  const auto lines = in.integer<size_t>();
  for (size_t i = 0; i < lines; ++i) {
    LogLine line;
    const std::string_view stream = in.next();
    if (stream != "e" && stream != "o") throw ProtocolError("malformed log chunk in the store");
    line.err = stream == "e";
    line.count = in.integer<int64_t>();
    const std::string_view ranks = in.next();
    for (const auto& rank : ranks.empty() ? std::vector<std::string>() : split(ranks, ',')) {
      const auto value = parseInteger<int>(rank);
      if (!value) throw ProtocolError("malformed rank in a log chunk in the store");
      line.ranks.push_back(*value);
    }
    const std::string_view nodes = in.next();
    if (!nodes.empty()) line.nodes = split(nodes, '\n');
    line.text = std::string(in.next());
    chunk.lines.push_back(std::move(line));
  }
  if (!in.done()) throw ProtocolError("malformed log chunk in the store");
  return chunk;
}

std::vector<LogLine> mergeLines(const std::vector<std::vector<LogLine>>& sources) {
  std::vector<LogLine> merged;
  // (stream, text, occurrence) -> its line in `merged`
  std::map<std::tuple<bool, std::string_view, int64_t>, size_t> index;
  std::vector<std::map<std::pair<bool, std::string_view>, int64_t>> seen(sources.size());
  size_t longest = 0;
  for (const auto& source : sources) longest = std::max(longest, source.size());
  merged.reserve(longest);
  // The keys view the sources' texts, which outlive the merge.
  for (size_t position = 0; position < longest; ++position) {
    for (size_t s = 0; s < sources.size(); ++s) {
      if (position >= sources[s].size()) continue;
      const LogLine& line = sources[s][position];
      const int64_t occurrence = seen[s][{line.err, line.text}]++;
      const auto [at, fresh] = index.try_emplace({line.err, line.text, occurrence}, merged.size());
      if (fresh) {
        merged.push_back(line);
        continue;
      }
      LogLine& into = merged[at->second];
      into.ranks.insert(into.ranks.end(), line.ranks.begin(), line.ranks.end());
      into.nodes.insert(into.nodes.end(), line.nodes.begin(), line.nodes.end());
      into.count += line.count;
    }
  }
  for (auto& line : merged) {
    std::sort(line.ranks.begin(), line.ranks.end());
    line.ranks.erase(std::unique(line.ranks.begin(), line.ranks.end()), line.ranks.end());
    std::sort(line.nodes.begin(), line.nodes.end());
    line.nodes.erase(std::unique(line.nodes.begin(), line.nodes.end()), line.nodes.end());
  }
  return merged;
}

}  // namespace dlrun::control
