#include "launcher/entry_point.h"

#include <unistd.h>

#include <filesystem>

#include "common/error.h"

namespace dlrun::launcher {

bool isExecutableFile(const std::string& path) {
  std::error_code ec;
  return std::filesystem::is_regular_file(path, ec) && ::access(path.c_str(), X_OK) == 0;
}

std::vector<std::string> resolveCommand(const std::string& entry,
                                        const std::vector<std::string>& args, EntryPointFlags flags,
                                        const HostProbe& host) {
  auto withArgs = [&](std::vector<std::string> head) {
    head.insert(head.end(), args.begin(), args.end());
    return head;
  };
  if (flags.runPath) {
    if (!host.fileExists(entry))
      throw ConfigError("--run-path: '" + entry + "' is no file (it runs a Python script)");
    return withArgs({host.pythonExec, "-u", entry});
  }
  if (flags.module) return withArgs({host.pythonExec, "-u", "-m", entry});
  if (!flags.noPython && entry == "train") {
    const std::string trainer = host.selfDir + "/dlrun-train";
    if (!host.fileExists(trainer))
      throw ConfigError("the bundled trainer is missing: " + trainer + " does not exist");
    return withArgs({trainer});
  }
  const bool isPath = entry.find('/') != std::string::npos;
  if (host.fileExists(entry)) {
    const bool python = !flags.noPython && (entry.ends_with(".py") || !isExecutableFile(entry));
    if (python) return withArgs({host.pythonExec, "-u", entry});
    // exec would search PATH for a bare name; "./" keeps it the file in this directory.
    return withArgs({isPath ? entry : "./" + entry});
  }
  if (!isPath) {
    if (auto found = host.findOnPath(entry)) return withArgs({*found});
  }
  throw ConfigError("entry point '" + entry + "' not found: neither a file nor a program on PATH");
}

}  // namespace dlrun::launcher
