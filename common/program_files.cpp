#include "common/program_files.h"

#include <filesystem>

namespace dlrun {

std::string findProgramFile(std::string_view name, std::string_view installedDir) {
  std::error_code ec;
  const auto programDir = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path();
  if (ec) return {};
  for (const auto& dir : {programDir, (programDir / installedDir).lexically_normal()}) {
    const auto path = dir / name;
    if (std::filesystem::exists(path, ec)) return path.string();
  }
  return {};
}

}  // namespace dlrun
