#include "agents/failure_report.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace dlrun::agents {

std::string readErrorFile(const std::string& path) {
  // A worker may leave anything at this path; only a regular file is read.
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return {};
  std::ifstream in(path);
  std::stringstream content;
  content << in.rdbuf();
  if (!in) return {};
  auto json = nlohmann::json::parse(content.str(), nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object() || !json.contains("message")) return {};
  const auto& message = json["message"];
  if (message.is_string()) return message.get<std::string>();
  if (!message.is_object()) return {};
  std::string text = message.value("message", "");
  if (message.contains("extraInfo") && message["extraInfo"].is_object()) {
    const auto& extra = message["extraInfo"];
    if (extra.contains("py_callstack") && extra["py_callstack"].is_string())
      text += "\n" + extra["py_callstack"].get<std::string>();
  }
  return text;
}

std::string formatFailureReport(const WorkerFailure& failure, int restartsUsed) {
  std::ostringstream out;
  out << "dlrun: worker failed: rank " << failure.rank << " (local rank " << failure.localRank
      << ")";
  if (!failure.node.empty()) out << " on " << failure.node;
  out << " ended with " << failure.status.describe();
  if (restartsUsed > 0) out << " after " << restartsUsed << " restart(s)";
  out << "\n";
  if (!failure.expiredTimer.empty()) out << "dlrun: " << failure.expiredTimer << "\n";
  auto indented = [&](const std::string& title, const std::string& text) {
    out << "dlrun: " << title << ":\n";
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);) out << "dlrun:   " << line << "\n";
  };
  if (!failure.errorMessage.empty()) {
    indented("error file of rank " + std::to_string(failure.rank), failure.errorMessage);
  }
  if (!failure.stderrTail.empty()) {
    std::string tail;
    for (const auto& line : failure.stderrTail) tail += line + "\n";
    indented("last lines of rank " + std::to_string(failure.rank) + "'s stderr", tail);
  }
  return out.str();
}

}  // namespace dlrun::agents
