#include "launcher/control_top.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <thread>

#include "common/error.h"
#include "control/state/stragglers.h"

namespace dlrun::launcher {

namespace {

constexpr size_t kEvents = 5;  // the job's last events under the ranks

bool ended(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::STOPPED;
}

std::string printed(const char* format, auto... values) {
  char text[512];
  std::snprintf(text, sizeof text, format, values...);
  return text;
}

std::string duration(double seconds) {
  if (seconds < 0) return "-";
  if (seconds < 10) return printed("%.1fs", seconds);
  if (seconds < 3600) return printed("%.0fs", seconds);
  return printed("%.1fh", seconds / 3600);
}

std::string rate(double perSecond) { return perSecond < 0 ? "-" : printed("%.2f", perSecond); }

struct RankLine {
  const v1::Node* node;
  const v1::Worker* worker;
};

}  // namespace

std::string formatTop(const v1::Job& job, const std::deque<v1::Event>& recent, int width,
                      int height) {
  std::vector<std::string> lines;
  std::vector<RankLine> ranks;
  std::vector<double> rates;
  int nodes = 0;
  for (const auto& node : job.nodes()) {
    if (node.replaced_by() != 0) continue;  // its place went to a later agent on its host
    ++nodes;
    for (const auto& w : node.workers()) {
      ranks.push_back({&node, &w});
      if (w.reported() && w.steps_per_second() >= 0) rates.push_back(w.steps_per_second());
    }
  }
  // Stragglers first, then by rank: in a big job the slow ones stay on the screen.
  std::sort(ranks.begin(), ranks.end(), [](const RankLine& a, const RankLine& b) {
    return std::pair(!a.worker->straggler(), a.worker->rank()) <
           std::pair(!b.worker->straggler(), b.worker->rank());
  });
  lines.push_back(printed("dlrun top  %s UTC  job %s (%s)", clockTime(job.time()).c_str(),
                          job.id().c_str(), job.backend().c_str()));
  lines.push_back(printed("%s, round %d, restarts %d/%d, nodes %d (%d:%d), ranks %zu",
                          stateName(job.state()), job.round(), job.restarts_used(),
                          job.max_restarts(), nodes, job.min_nodes(), job.max_nodes(),
                          ranks.size()));
  lines.push_back(printed("median pace %s steps/s, stragglers %d",
                          rates.empty() ? "-" : rate(control::median(rates)).c_str(),
                          job.stragglers_size()));
  if (!job.root_cause().empty()) {
    const std::string& cause = job.root_cause();
    lines.push_back("root cause: " + cause.substr(0, cause.find('\n')));
  }
  // A node sitting out has no ranks to show: a line of its own says which and why.
  for (const auto& node : job.nodes())
    if (node.replaced_by() == 0 && !node.sitting_out().empty())
      lines.push_back(printed("sits out: %s (agent %d): ", node.name().c_str(), node.agent()) +
                      node.sitting_out());
  lines.push_back(printed("%-12s %3s %-8s %5s %7s %9s %7s %6s %8s", "NODE", "AG", "STATE", "RANK",
                          "PID", "STEP", "STEPS/S", "IDLE", "LOSS"));
  const size_t maxLines = static_cast<size_t>(std::max(height, 8));
  const size_t eventLines = std::min(recent.size(), kEvents) + (recent.empty() ? 0 : 1);
  const size_t fixed = lines.size() + eventLines;
  const size_t room = fixed + 3 <= maxLines ? maxLines - fixed : 3;     // a few ranks at least
  const size_t shown = ranks.size() <= room ? ranks.size() : room - 1;  // and "... more"

  for (size_t i = 0; i < shown; ++i) {
    const v1::Node& n = *ranks[i].node;
    const v1::Worker& w = *ranks[i].worker;
    const bool reported = w.reported();
    std::string state = w.state();
    if (!w.exit().empty()) state = w.state() == "succeeded" ? "done" : w.exit();
    lines.push_back(printed("%-12.12s %3d %-8.8s %5d %7d %9s %7s %6s %8s %s", n.name().c_str(),
                            n.agent(), state.c_str(), w.rank(), w.pid(),
                            reported ? std::to_string(w.step()).c_str() : "-",
                            reported ? rate(w.steps_per_second()).c_str() : "-",
                            reported ? duration(w.since_step()).c_str() : "-",
                            reported && w.has_loss() ? printed("%.4g", w.loss()).c_str() : "-",
                            w.straggler() ? "SLOW" : ""));
  }
  if (shown < ranks.size())
    lines.push_back(
        printed("... and %zu more ranks (dlrun status lists all)", ranks.size() - shown));
  if (!recent.empty()) lines.push_back("events:");
  const size_t from = recent.size() > kEvents ? recent.size() - kEvents : 0;
  for (size_t i = from; i < recent.size(); ++i) {
    const v1::Event& e = recent[i];
    lines.push_back(
        printed(" %s %-14s %s", clockTime(e.time()).c_str(), e.kind().c_str(), e.detail().c_str()));
  }
  std::string out;
  for (size_t i = 0; i < lines.size() && i < maxLines; ++i) {
    std::string& line = lines[i];
    while (!line.empty() && line.back() == ' ') line.pop_back();
    if (line.size() > static_cast<size_t>(width)) line.resize(static_cast<size_t>(width));
    out += line + "\n";
  }
  return out;
}

int top(const ControlRequest& request, const TopSource& source) {
  std::deque<v1::Event> recent;
  int64_t seen = 0;
  bool everEnded = false;
  for (bool first = true;; first = false) {
    v1::Job job;
    try {
      job = source.job();
      for (auto& e : source.events(seen)) {
        seen = std::max(seen, e.seq());
        recent.push_back(std::move(e));
        if (recent.size() > kEvents) recent.pop_front();
      }
    } catch (const ConfigError& e) {
      if (first) throw;
      // The store goes with a job whose agent served it: the last frame stays on the screen.
      std::cerr << "dlrun top: " << e.what() << "\n";
      return everEnded ? 0 : 1;
    }
    winsize size{};
    const bool terminal = ::isatty(STDOUT_FILENO) && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0;
    const int width = terminal && size.ws_col > 0 ? size.ws_col : 80;
    const int height = request.once || !terminal || size.ws_row == 0 ? 1000 : size.ws_row - 1;
    // Home and clear, then the frame: no library, any terminal.
    std::cout << (request.once ? "" : "\x1b[H\x1b[2J") << formatTop(job, recent, width, height)
              << std::flush;
    everEnded = ended(job.state());
    if (request.once || everEnded) return 0;
    std::this_thread::sleep_for(request.interval);
  }
}

}  // namespace dlrun::launcher
