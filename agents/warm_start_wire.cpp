#include "agents/warm_start_wire.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "common/error.h"
#include "common/text.h"

namespace dlrun::agents::warm {
namespace {

// python, python3, python3.11: what a Python interpreter is called on PATH and in a venv.
bool namedPython(std::string_view path) {
  const std::string_view name = path.substr(path.rfind('/') + 1);
  if (!name.starts_with("python")) return false;
  const std::string_view version = name.substr(6);
  return std::all_of(version.begin(), version.end(), [](char c) {
    return std::isdigit(static_cast<unsigned char>(c)) || c == '.';
  });
}

ConfigError refused(const std::string& why) { return ConfigError("--warm-start: " + why); }

// Options that only change how the interpreter runs, which the zygote, started with the same
// options, shares with every worker it forks.
constexpr std::string_view kPlainOptions = "bBdEIOPqRsSuv";

}  // namespace

bool isPythonInterpreter(std::string_view path, std::string_view pythonExec) {
  return path == pythonExec || namedPython(path);
}

PythonCommand parsePythonCommand(const std::vector<std::string>& argv,
                                 std::string_view pythonExec) {
  if (argv.empty()) throw refused("no entry point");
  if (!isPythonInterpreter(argv.front(), pythonExec))
    throw refused("the entry point runs " + argv.front() +
                  ", which is no Python interpreter; warm starts fork a Python interpreter "
                  "that runs a script or -m MODULE");
  PythonCommand command{.interpreter = {argv.front()}};
  size_t i = 1;
  for (; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-") throw refused("a script read from stdin cannot be warm-started");
    if (!arg.starts_with("-")) break;
    if (arg == "--check-hash-based-pycs" && i + 1 < argv.size()) {
      command.interpreter.insert(command.interpreter.end(), {arg, argv[++i]});
      continue;
    }
    if (arg.starts_with("--")) throw refused("the interpreter option " + arg + " is not supported");
    for (size_t j = 1; j < arg.size(); ++j) {
      const char c = arg[j];
      const std::string rest = arg.substr(j + 1);
      if (c == 'm' || c == 'W' || c == 'X') {
        if (rest.empty() && i + 1 == argv.size())
          throw refused(std::string("-") + c + " needs a value");
        const std::string value = rest.empty() ? argv[++i] : rest;
        if (c == 'm') {
          command.module = true;
          command.target = value;
          return command;
        }
        command.interpreter.insert(command.interpreter.end(), {std::string("-") + c, value});
        break;
      }
      if (c == 'c') throw refused("python -c cannot be warm-started (give a script or -m)");
      if (kPlainOptions.find(c) == std::string_view::npos)
        throw refused(std::string("the interpreter option -") + c + " is not supported");
      command.interpreter.push_back(std::string("-") + c);
    }
  }
  if (i >= argv.size()) throw refused("the Python command names no script or -m MODULE");
  command.target = argv[i];
  return command;
}

std::vector<std::string> parsePreload(std::string_view list) {
  std::vector<std::string> modules;
  for (const std::string& name : split(list, ',')) {
    bool valid = !name.empty();
    bool atStart = true;  // of a dotted part
    for (char c : name) {
      const bool letter = std::isalpha(static_cast<unsigned char>(c)) || c == '_';
      const bool digit = std::isdigit(static_cast<unsigned char>(c));
      if (c == '.') {
        valid = valid && !atStart;
        atStart = true;
      } else {
        valid = valid && (letter || (digit && !atStart));
        atStart = false;
      }
    }
    if (!valid || atStart)
      throw ConfigError("--preload: '" + name + "' is not a module name (MOD[,MOD...])");
    modules.push_back(name);
  }
  return modules;
}

namespace {

class Writer {
 public:
  explicit Writer(uint8_t kind) { out_.append(4, '\0').push_back(static_cast<char>(kind)); }
  void u32(uint32_t value) {
    for (int shift = 0; shift < 32; shift += 8) out_.push_back(static_cast<char>(value >> shift));
  }
  void text(std::string_view s) {
    u32(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  void texts(const std::vector<std::string>& list) {
    u32(static_cast<uint32_t>(list.size()));
    for (const auto& s : list) text(s);
  }
  std::string frame() && {
    const auto length = static_cast<uint32_t>(out_.size() - 4);
    for (int i = 0; i < 4; ++i) out_[i] = static_cast<char>(length >> (8 * i));
    return std::move(out_);
  }

 private:
  std::string out_;
};

class Reader {
 public:
  explicit Reader(std::string_view body) : in_(body) {}
  uint32_t u32() {
    need(4);
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) value |= uint32_t{static_cast<uint8_t>(in_[i])} << (8 * i);
    in_.remove_prefix(4);
    return value;
  }
  uint8_t u8() {
    need(1);
    const auto value = static_cast<uint8_t>(in_[0]);
    in_.remove_prefix(1);
    return value;
  }
  std::string text() {
    const uint32_t size = u32();
    need(size);
    std::string value(in_.substr(0, size));
    in_.remove_prefix(size);
    return value;
  }
  void end() const {
    if (!in_.empty()) throw ProtocolError("warm start: a zygote frame has bytes left over");
  }

 private:
  void need(size_t size) const {
    if (in_.size() < size) throw ProtocolError("warm start: a zygote frame ends inside a field");
  }
  std::string_view in_;
};

}  // namespace

std::string encodeSpawn(const SpawnMessage& message) {
  Writer out(static_cast<uint8_t>(Kind::Spawn));
  out.u32(message.agentPid);
  out.texts(message.argv);
  out.texts(message.envp);
  out.text(message.cwd);
  out.u32(static_cast<uint32_t>(message.cpus.size()));
  for (int cpu : message.cpus) out.u32(static_cast<uint32_t>(cpu));
  return std::move(out).frame();
}

std::optional<Reply> decodeReply(std::string_view buffer, size_t& used) {
  if (buffer.size() < 4) return std::nullopt;
  Reader head(buffer.substr(0, 4));
  const uint32_t length = head.u32();
  if (length == 0 || length > kMaxFrame)
    throw ProtocolError("warm start: a zygote frame of " + std::to_string(length) + " bytes");
  if (buffer.size() - 4 < length) return std::nullopt;
  Reader in(buffer.substr(4, length));
  Reply reply;
  reply.kind = static_cast<Reply::Kind>(in.u8());
  switch (reply.kind) {
    case Reply::Kind::Spawned: reply.pid = in.u32(); break;
    case Reply::Kind::Ready:
    case Reply::Kind::Refused:
    case Reply::Kind::Failed: reply.text = in.text(); break;
    default:
      throw ProtocolError("warm start: a zygote frame of unknown kind " +
                          std::to_string(static_cast<int>(reply.kind)));
  }
  in.end();
  used = 4 + length;
  return reply;
}

std::string encodeReply(const Reply& reply) {
  Writer out(static_cast<uint8_t>(reply.kind));
  if (reply.kind == Reply::Kind::Spawned)
    out.u32(reply.pid);
  else
    out.text(reply.text);
  return std::move(out).frame();
}

}  // namespace dlrun::agents::warm
