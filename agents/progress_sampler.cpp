#include "agents/progress_sampler.h"

#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/program_files.h"

namespace dlrun::agents {

namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxMetrics = 8;       // names a worker may report beside its loss
constexpr size_t kMaxMetricName = 32;   // characters
constexpr auto kMaxMetricsFile = 4096;  // bytes: more is not what dlrun's module writes

double seconds(auto timePoint) {
  return std::chrono::duration<double>(timePoint.time_since_epoch()).count();
}

}  // namespace

std::string pythonModulesDir() {
  const std::string init = findProgramFile("dlrun/__init__.py", DLRUN_PYTHON_DIR);
  return init.empty() ? std::string() : fs::path(init).parent_path().parent_path().string();
}

std::map<std::string, double> parseReportedMetrics(const std::string& text) {
  std::map<std::string, double> out;
  const auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return out;
  for (const auto& [name, value] : j.items()) {
    if (out.size() == kMaxMetrics) break;
    if (name.empty() || name.size() > kMaxMetricName || !value.is_number()) continue;
    const double number = value.get<double>();
    if (std::isfinite(number)) out[name] = number;
  }
  return out;
}

ProgressSampler::ProgressSampler(boost::asio::io_context& io,
                                 std::function<void(const ProgressSample&)> onLook)
    : onLook_(std::move(onLook)), timer_(io) {
  look();
}

ProgressSampler::~ProgressSampler() = default;

void ProgressSampler::prepareRound(const fs::path& attemptDir, int workers, RoundSpec& spec) {
  fs::create_directories(attemptDir);
  board_.reset();  // unlinks the last round's file first: the new one may take its name
  board_ = std::make_unique<ProgressBoard>(attemptDir / "progress", workers);
  metrics_.assign(static_cast<size_t>(workers), MetricsFile{});
  spec.services["DLRUN_PROGRESS_FILE"] = board_->path().string();
}

// A worker rewrites its file whole (rename), at most once a second: read it when it changed.
std::map<std::string, double> ProgressSampler::readMetrics(int local) {
  MetricsFile& file = metrics_[static_cast<size_t>(local)];
  const fs::path path = board_->path().string() + ".metrics." + std::to_string(local);
  std::error_code error;
  const auto changed = fs::last_write_time(path, error);
  if (error || changed == file.changed) return file.values;
  file.changed = changed;
  std::ifstream in(path, std::ios::binary);
  std::string text(kMaxMetricsFile, '\0');
  in.read(text.data(), kMaxMetricsFile);
  text.resize(static_cast<size_t>(in.gcount()));
  file.values = parseReportedMetrics(text);
  return file.values;
}

void ProgressSampler::look() {
  if (board_) {
    ProgressSample sample{.now = seconds(std::chrono::steady_clock::now()),
                          .wall = seconds(std::chrono::system_clock::now())};
    sample.board.reserve(static_cast<size_t>(board_->workers()));
    for (int local = 0; local < board_->workers(); ++local) {
      sample.board.push_back(board_->read(local));
      sample.metrics.push_back(sample.board.back().beats ? readMetrics(local)
                                                         : std::map<std::string, double>{});
    }
    onLook_(sample);
  }
  timer_.expires_after(kEvery);
  timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) look();
  });
}

}  // namespace dlrun::agents
