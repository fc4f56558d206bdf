#include "agents/torch_probe.h"

#include <nlohmann/json.hpp>

#include "agents/tool_run.h"
#include "common/error.h"
#include "common/program_files.h"
#include "common/text.h"

namespace dlrun::agents {

bool TorchBuild::refusesAgentStore() const {
  if (libuv.value_or(true)) return false;
  const std::vector<std::string> parts = split(version, '.');
  if (parts.size() < 2) return true;  // no libuv and no version to tell: the safe side
  const auto major = parseInteger<int>(parts[0]);
  const auto minor = parseInteger<int>(parts[1]);
  return !major || !minor || *major > 2 || (*major == 2 && *minor >= 4);
}

std::optional<TorchBuild> parseTorchProbe(std::string_view line) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (!j.is_object() || !j.contains("path") || !j["path"].is_string()) return std::nullopt;
  TorchBuild build{.path = j["path"]};
  if (j.contains("version") && j["version"].is_string()) build.version = j["version"];
  if (j.contains("libuv") && j["libuv"].is_boolean()) build.libuv = j["libuv"].get<bool>();
  return build;
}

std::optional<TorchBuild> probeTorch(const std::string& interpreter,
                                     std::chrono::milliseconds limit) {
  const std::string probe = findProgramFile("dlrun_torch_probe.py", DLRUN_PYTHON_DIR);
  if (probe.empty()) return std::nullopt;
  try {
    ToolRun run("the torch probe", {interpreter, probe});
    if (!run.finishWithin(limit) || !run.succeeded()) return std::nullopt;
    return parseTorchProbe(run.out());
  } catch (const Error&) {  // the interpreter cannot start: the workers' start says why
    return std::nullopt;
  }
}

}  // namespace dlrun::agents
