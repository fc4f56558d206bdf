#include "agents/stack_text.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <unordered_map>

namespace dlrun::agents {
namespace {

// Calls `f` with each line of `text`, without its newline.
template <typename F>
void forEachLine(std::string_view text, F&& f) {
  while (!text.empty()) {
    const size_t end = text.find('\n');
    f(text.substr(0, end));
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
}

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::optional<long> numberAt(std::string_view s) {
  long value = 0;
  const auto [end, error] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (error != std::errc() || end == s.data()) return std::nullopt;
  return value;
}

// "#12 " at the start of a frame line: the rest of the line after it, or nullopt.
std::optional<std::string_view> afterFrameNumber(std::string_view line) {
  if (!line.starts_with('#')) return std::nullopt;
  size_t at = 1;
  while (at < line.size() && std::isdigit(static_cast<unsigned char>(line[at]))) ++at;
  if (at == 1) return std::nullopt;
  return trimmed(line.substr(at));
}

std::string_view skipAddress(std::string_view s) {
  if (!s.starts_with("0x")) return s;
  size_t at = 2;
  while (at < s.size() && std::isxdigit(static_cast<unsigned char>(s[at]))) ++at;
  return trimmed(s.substr(at));
}

// gdb's "NAME (ARGS) at FILE:LINE": NAME ends at the first " (" outside brackets, so
// "(anonymous namespace)" and "std::function<void (int)>" stay whole.
std::string_view gdbFunction(std::string_view s) {
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '(' && depth == 0 && i > 0 && s[i - 1] == ' ') return trimmed(s.substr(0, i));
    if (c == '<' || c == '(') ++depth;
    if ((c == '>' || c == ')') && depth > 0) --depth;
  }
  return s;
}

// "clock_nanosleep@GLIBC_2.2.5" -> "clock_nanosleep": symbol versions say nothing here.
std::string withoutVersion(std::string_view name) {
  const size_t at = name.find('@');
  if (at != std::string_view::npos && name.find_first_of(" ()<>", at) == std::string_view::npos)
    name = name.substr(0, at);
  return std::string(name);
}

// "c10d::Work::wait(std::chrono::duration<...>)" -> "c10d::Work::wait".
std::string_view withoutParameters(std::string_view name) {
  if (name.ends_with(" const")) name.remove_suffix(6);
  if (!name.ends_with(')')) return name;
  int depth = 0;
  for (size_t i = name.size(); i-- > 0;) {
    if (name[i] == ')') ++depth;
    if (name[i] == '(' && --depth == 0) return i > 0 ? name.substr(0, i) : name;
  }
  return name;
}

std::string lowered(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// torch.distributed's blocking calls, as distributed_c10d.py names them; init_process_group and
// new_group wait for every rank too.
constexpr std::array kTorchCollectives = {
    "all_reduce",
    "all_reduce_coalesced",
    "all_reduce_multigpu",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_coalesced",
    "all_gather_multigpu",
    "_all_gather_base",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "monitored_barrier",
    "broadcast",
    "broadcast_multigpu",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "reduce",
    "reduce_multigpu",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_multigpu",
    "_reduce_scatter_base",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
    "send_object_list",
    "recv_object_list",
    "init_process_group",
    "new_group",
};

// Op names as gloo, NCCL and ProcessGroup*'s methods spell them (lowered), longest first where
// one begins another: "reducescatter" before "reduce".
constexpr std::array<std::pair<std::string_view, std::string_view>, 13> kNativeOps = {{
    {"allreduce", "all_reduce"},
    {"allgather", "all_gather"},
    {"alltoall", "all_to_all"},
    {"reduce_scatter", "reduce_scatter"},
    {"reducescatter", "reduce_scatter"},
    {"reduce", "reduce"},
    {"broadcast", "broadcast"},
    {"bcast", "broadcast"},
    {"barrier", "barrier"},
    {"gather", "gather"},
    {"scatter", "scatter"},
    {"send", "send"},
    {"recv", "recv"},
}};

// Where a native function's name goes on with an op: gloo's algorithms (gloo::allreduce,
// gloo::AllreduceRing), ProcessGroupGloo's work (AsyncAllreduceWork) and methods, NCCL's calls
// (ncclAllReduce). gloo's transport, ProcessGroupGloo::runLoop and NCCL's proxies name none.
constexpr std::array kOpPrefixes = {"gloo::", "c10d::ProcessGroupGloo::Async",
                                    "c10d::ProcessGroupGloo::", "c10d::ProcessGroupNCCL::", "nccl"};

// Waits on a collective that name no op: a caller blocked on its work, gloo's transfers.
constexpr std::array kCollectiveWaits = {"c10d::Work::wait",
                                         "c10d::ProcessGroup::Work::wait",
                                         "c10d::ProcessGroupNCCL::WorkNCCL::wait",
                                         "c10d::ProcessGroupNCCL::WorkNCCL::synchronize",
                                         "c10d::ProcessGroupGloo::AsyncWork::execute",
                                         "gloo::transport::tcp::UnboundBuffer::wait",
                                         "gloo::rendezvous::Context::connectFullMesh"};

std::optional<std::string> nativeOp(std::string_view name) {
  // dlrun-train's Collective has one operation.
  if (name.find("SharedMemoryCollective::") != std::string_view::npos ||
      name.find("GlooCollective::") != std::string_view::npos)
    return "all_reduce";
  for (std::string_view prefix : kOpPrefixes) {
    if (!name.starts_with(prefix)) continue;
    const std::string rest = lowered(name.substr(prefix.size()));
    for (const auto& [spelling, op] : kNativeOps) {
      if (rest.starts_with(spelling)) return std::string(op);
    }
  }
  return std::nullopt;
}

const StackThread* mainThread(const std::vector<StackThread>& threads) {
  for (const auto& t : threads) {
    if (t.main) return &t;
  }
  return threads.empty() ? nullptr : &threads.back();
}

std::string_view baseName(std::string_view path) {
  const size_t slash = path.rfind('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

// The width of the length before a string opcode's bytes: BINUNICODE, BINBYTES, BINSTRING,
// their SHORT_ (1-byte length) and 8-byte forms; 0 for any other opcode.
size_t stringLengthWidth(uint8_t op) {
  switch (op) {
    case 'X':
    case 'B':
    case 'T': return 4;
    case 0x8c:
    case 'C':
    case 'U': return 1;
    case 0x8d:
    case 0x8e: return 8;
    default: return 0;
  }
}

// Containers, constants, calls: opcodes with no argument, which leave nothing this reads on top.
bool isBareOp(uint8_t op) {
  static constexpr uint8_t kOps[] = {
      '}', ']', ')',  '(',  'u', 's', 'e', 'a',  't', 0x85, 0x86, 0x87, 'N', 0x88, 0x89,
      'R', 'b', 0x81, 0x92, '0', '1', '2', 0x93, 'Q', 0x8f, 0x90, 0x91, 'd', 'l',
  };
  return std::ranges::find(kOps, op) != std::end(kOps);
}

// The strings and integers (in decimal) of a pickle, in stream order, memo references resolved.
// Stops at STOP, at the end, or at an opcode it does not know.
std::vector<std::string> pickleScalars(std::string_view data) {
  std::vector<std::string> out;
  std::unordered_map<uint64_t, std::optional<std::string>> memo;  // nullopt: not a scalar
  std::optional<std::string> top;  // the scalar on top of the stack, if that is one
  size_t at = 0;
  const auto has = [&](uint64_t n) { return n <= data.size() - at; };
  const auto little = [&](size_t n) {
    uint64_t value = 0;
    for (size_t i = 0; i < n; ++i) value |= uint64_t{static_cast<uint8_t>(data[at + i])} << (8 * i);
    at += n;
    return value;
  };
  const auto push = [&](std::string value) {
    out.push_back(value);
    top = std::move(value);
  };
  while (at < data.size()) {
    const auto op = static_cast<uint8_t>(data[at++]);
    if (const size_t width = stringLengthWidth(op)) {
      if (!has(width)) return out;
      const uint64_t n = little(width);
      if (!has(n)) return out;
      push(std::string(data.substr(at, n)));
      at += n;
      continue;
    }
    switch (op) {
      case 'K':
      case 'M':
      case 'J': {  // BININT1, BININT2, BININT (signed 32-bit)
        const size_t width = op == 'K' ? 1 : op == 'M' ? 2 : 4;
        if (!has(width)) return out;
        const uint64_t raw = little(width);
        push(std::to_string(op == 'J' ? int64_t{static_cast<int32_t>(raw)}
                                      : static_cast<int64_t>(raw)));
        break;
      }
      case 0x8a: {  // LONG1: little-endian two's complement
        if (!has(1)) return out;
        const uint64_t n = little(1);
        if (!has(n)) return out;
        if (n == 0 || n > 8) {
          at += n;
          top.reset();
          break;
        }
        uint64_t raw = little(n);
        if (n < 8 && (raw >> (8 * n - 1)) != 0) raw |= ~uint64_t{0} << (8 * n);
        push(std::to_string(static_cast<int64_t>(raw)));
        break;
      }
      case 0x8b: {  // LONG4
        if (!has(4)) return out;
        const uint64_t n = little(4);
        if (!has(n)) return out;
        at += n;
        top.reset();
        break;
      }
      case 0x80:
      case 'G':
      case 0x95: {  // PROTO, BINFLOAT, FRAME
        const size_t width = op == 0x80 ? 1 : 8;
        if (!has(width)) return out;
        at += width;
        if (op == 'G') top.reset();
        break;
      }
      case 'q':
      case 'r': {  // BINPUT, LONG_BINPUT: the top stays
        const size_t width = op == 'q' ? 1 : 4;
        if (!has(width)) return out;
        memo[little(width)] = top;
        break;
      }
      case 0x94:  // MEMOIZE
        memo[memo.size()] = top;
        break;
      case 'h':
      case 'j': {  // BINGET, LONG_BINGET
        const size_t width = op == 'h' ? 1 : 4;
        if (!has(width)) return out;
        const auto it = memo.find(little(width));
        if (it != memo.end() && it->second) {
          push(*it->second);
        } else {
          top.reset();
        }
        break;
      }
      case 'c': {  // GLOBAL: module and name, one line each
        for (int i = 0; i < 2; ++i) {
          const size_t end = data.find('\n', at);
          if (end == std::string_view::npos) return out;
          at = end + 1;
        }
        top.reset();
        break;
      }
      default:
        if (!isBareOp(op)) return out;  // STOP, or what this does not know
        top.reset();
        break;
    }
  }
  return out;
}

}  // namespace

std::vector<StackThread> parseEuStack(std::string_view text, pid_t pid) {
  std::vector<StackThread> threads;
  forEachLine(text, [&](std::string_view line) {
    if (line.starts_with("TID ")) {
      threads.push_back({.main = numberAt(line.substr(4)) == long{pid}});
      return;
    }
    const auto rest = afterFrameNumber(line);
    if (!rest || threads.empty()) return;
    threads.back().frames.push_back({.function = withoutVersion(skipAddress(*rest))});
  });
  return threads;
}

std::vector<StackThread> parseGdbBacktrace(std::string_view text, pid_t pid) {
  std::vector<StackThread> threads;
  forEachLine(text, [&](std::string_view line) {
    if (line.starts_with("Thread ") && line.ends_with(":")) {
      // "Thread 2 (Thread 0x7f... (LWP 1235) "name"):", "Thread 1 (process 1234):"
      std::optional<long> id;
      for (std::string_view key : {"(LWP ", "(process "}) {
        if (const size_t at = line.find(key); at != std::string_view::npos)
          id = numberAt(line.substr(at + key.size()));
      }
      threads.push_back({.main = id == long{pid}});
      return;
    }
    auto rest = afterFrameNumber(line);
    if (!rest || threads.empty()) return;
    if (rest->starts_with("0x")) {
      *rest = skipAddress(*rest);
      if (rest->starts_with("in ")) rest->remove_prefix(3);
    }
    const std::string_view name = gdbFunction(*rest);
    threads.back().frames.push_back({.function = name == "??" ? "" : std::string(name)});
  });
  return threads;
}

std::vector<StackThread> parseFaulthandler(std::string_view text) {
  std::vector<StackThread> threads;
  forEachLine(text, [&](std::string_view line) {
    if (trimmed(line).ends_with("(most recent call first):")) {
      threads.emplace_back();
      return;
    }
    // '  File "/path/train.py", line 12 in step'
    const std::string_view frame = trimmed(line);
    constexpr std::string_view kFile = "File \"", kLine = "\", line ", kIn = " in ";
    if (!frame.starts_with(kFile) || threads.empty()) return;
    const size_t fileEnd = frame.find(kLine);
    if (fileEnd == std::string_view::npos) return;
    const std::string_view afterLine = frame.substr(fileEnd + kLine.size());
    const size_t in = afterLine.find(kIn);
    threads.back().frames.push_back(
        {.function =
             in == std::string_view::npos ? "" : std::string(afterLine.substr(in + kIn.size())),
         .file = std::string(frame.substr(kFile.size(), fileEnd - kFile.size())),
         .line = static_cast<int>(numberAt(afterLine).value_or(0))});
  });
  for (auto& t : threads) {
    if (!t.frames.empty() && t.frames.back().function == "<module>") {
      t.main = true;
      break;
    }
  }
  return threads;
}

std::optional<std::string> findCollective(const std::vector<StackThread>& python,
                                          const std::vector<StackThread>& native) {
  for (const auto& thread : python) {
    for (const auto& f : thread.frames) {
      if (f.file.ends_with("distributed_c10d.py") &&
          std::find(kTorchCollectives.begin(), kTorchCollectives.end(), f.function) !=
              kTorchCollectives.end())
        return f.function;
    }
  }
  // The main thread's wait first: where the program itself is, rather than its helpers.
  std::vector<const StackThread*> threads;
  for (const auto& t : native) threads.insert(t.main ? threads.begin() : threads.end(), &t);
  std::optional<std::string> wait;
  for (const StackThread* thread : threads) {
    for (const auto& f : thread->frames) {
      const std::string_view name = withoutParameters(f.function);
      if (auto op = nativeOp(name)) return op;
      if (!wait && std::any_of(kCollectiveWaits.begin(), kCollectiveWaits.end(),
                               [&](std::string_view w) { return name.starts_with(w); }))
        wait = std::string(name);
    }
  }
  return wait;
}

std::vector<std::string> topFrames(const std::vector<StackThread>& python,
                                   const std::vector<StackThread>& native, size_t count) {
  std::vector<std::string> top;
  if (const StackThread* t = mainThread(python)) {
    for (const auto& f : t->frames) {
      if (top.size() == count) break;
      top.push_back(f.function + " (" + std::string(baseName(f.file)) + ":" +
                    std::to_string(f.line) + ")");
    }
  }
  if (!top.empty()) return top;
  if (const StackThread* t = mainThread(native)) {
    for (const auto& f : t->frames) {
      if (top.size() == count) break;
      if (!f.function.empty()) top.emplace_back(withoutParameters(f.function));
    }
  }
  return top;
}

std::optional<std::string> lastFlightRecorderCollective(std::string_view dump) {
  const std::vector<std::string> tokens = pickleScalars(dump);
  size_t name = tokens.size();
  for (size_t i = 0; i + 1 < tokens.size(); ++i) {
    if (tokens[i] == "profiling_name") name = i + 1;
  }
  if (name == tokens.size()) return std::nullopt;
  // "nccl:all_reduce" -> "all_reduce"
  std::string_view op = tokens[name];
  if (const size_t colon = op.find(':'); colon != std::string_view::npos)
    op.remove_prefix(colon + 1);
  if (op.empty()) return std::nullopt;
  // The entry's sequence number comes before its name, its state after it.
  std::string details;
  for (size_t i = name - 1; i-- > 0 && tokens[i] != "profiling_name";) {
    if (tokens[i] == "collective_seq_id" || tokens[i] == "seq_id") {
      details = "seq " + tokens[i + 1];
      break;
    }
  }
  for (size_t i = name + 1; i + 1 < tokens.size(); ++i) {
    if (tokens[i] == "state") {
      details += (details.empty() ? "" : ", ") + tokens[i + 1];
      break;
    }
  }
  return std::string(op) + (details.empty() ? "" : " (" + details + ")");
}

}  // namespace dlrun::agents
