// The pure parts of warm starts (warm_start.h, docs/guides/warm-start.md): which worker commands a
// Python zygote can run, and the frames the agent and the zygote (python/dlrun_warm_start.py)
// exchange over their socket. No I/O, so tests check every byte.
//
// A frame is a uint32 length (of what follows), a uint8 kind, then the kind's fields; integers
// are little-endian, a string is a uint32 length then its bytes, a list a uint32 count then its
// items. The agent sends Spawn: uint32 agent pid, list of argv strings, list of "KEY=VALUE"
// strings (the whole environment, as exec would get it), the working directory, list of uint32
// CPUs (--numa-binding; empty: the zygote's); its first byte carries four descriptors
// (SCM_RIGHTS): the worker's stdin, stdout, stderr and the read end of its "go" pipe. The zygote
// answers Ready (text: what it preloaded) or Refused (text: why it cannot serve) once, then one
// Spawned (uint32 pid) or Failed (text) per Spawn.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlrun::agents::warm {

// A worker command a zygote can run: the interpreter with its options, then a script or -m
// MODULE and their arguments.
struct PythonCommand {
  std::vector<std::string> interpreter;  // argv[0] and its options, one word each ("-u")
  bool module = false;                   // -m MODULE; else a script
  std::string target;                    // the script's path or the module's name
};

// Whether argv[0] `path` runs a Python interpreter: dlrun's own pick `pythonExec`, or a program
// named python, python3, python3.11...
bool isPythonInterpreter(std::string_view path, std::string_view pythonExec);

// `argv` as a PythonCommand; `pythonExec` is the interpreter dlrun itself picks for a .py
// script or -m (any other argv[0] must be named python, python3, python3.11...). Throws
// ConfigError, one line naming --warm-start, for a program that is not Python, -c, a script
// from stdin, or an interpreter option that would not run the program (-i, -h, -V, -x).
PythonCommand parsePythonCommand(const std::vector<std::string>& argv, std::string_view pythonExec);

// --preload's list: dotted module names, comma-separated. Throws ConfigError naming the one
// that is not.
std::vector<std::string> parsePreload(std::string_view list);

enum class Kind : uint8_t { Spawn = 1 };

struct SpawnMessage {
  uint32_t agentPid = 0;
  std::vector<std::string> argv;
  std::vector<std::string> envp;  // "KEY=VALUE"
  std::string cwd;
  std::vector<int> cpus;
};

// The descriptors a Spawn carries, in this order.
inline constexpr int kSpawnDescriptors = 4;

std::string encodeSpawn(const SpawnMessage& message);

struct Reply {
  enum class Kind : uint8_t { Ready = 1, Refused = 2, Spawned = 3, Failed = 4 };
  Kind kind = Kind::Ready;
  uint32_t pid = 0;  // Spawned
  std::string text;  // Ready, Refused, Failed
};

// The largest frame either side accepts (an environment holds at most a few MiB).
inline constexpr uint32_t kMaxFrame = 64u << 20;

// The frame at the start of `buffer`, and its size in `used`; nothing while it is incomplete.
// Throws ProtocolError on an unknown kind, a frame over kMaxFrame or fields that do not fit.
std::optional<Reply> decodeReply(std::string_view buffer, size_t& used);
std::string encodeReply(const Reply& reply);  // the zygote's side, for tests

}  // namespace dlrun::agents::warm
