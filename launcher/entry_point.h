// Entry-point resolution: what the user wrote after dlrun's flags (a program, a path, a .py
// script, a module, or `train`) into the argv every worker runs. Reads the machine only through
// the HostProbe, except for the executable bit of an existing file.
#pragma once

#include <string>
#include <vector>

#include "launcher/host_probe.h"

namespace dlrun::launcher {

struct EntryPointFlags {
  bool module = false;    // -m: run the entry point as `python -u -m ENTRY`
  bool noPython = false;  // --no-python: execute the entry point itself, whatever its name
  // --run-path: the entry point is a Python script, whatever -m and --no-python say (torchrun
  // runs it with runpy.run_path, which sees the same argv and __main__)
  bool runPath = false;
};

// The worker's argv: argv[0] is an absolute path, a relative path with a '/', or the Python
// interpreter, followed by `args`. Throws ConfigError naming the entry point when it is neither
// a file nor a program on PATH, or when `train` finds no bundled trainer beside dlrun.
std::vector<std::string> resolveCommand(const std::string& entry,
                                        const std::vector<std::string>& args, EntryPointFlags flags,
                                        const HostProbe& host);

// Whether `path` is a regular file this process may execute.
bool isExecutableFile(const std::string& path);

}  // namespace dlrun::launcher
