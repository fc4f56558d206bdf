#include "agents/rank_rates.h"

#include <algorithm>

namespace dlrun::agents {

void RankRates::reset(int round, int baseRank, int workers) {
  round_ = round;
  baseRank_ = baseRank;
  tracks_.assign(static_cast<size_t>(std::max(workers, 0)), Track{});
}

control::NodeProgress RankRates::observe(const std::vector<ProgressReading>& board,
                                         const std::vector<std::map<std::string, double>>& metrics,
                                         double now, double wall) {
  control::NodeProgress out{.time = wall, .round = round_, .period = period_};
  const size_t n = std::min(board.size(), tracks_.size());
  for (size_t local = 0; local < n; ++local) {
    const ProgressReading& r = board[local];
    if (r.beats == 0) continue;  // nothing reported yet
    Track& t = tracks_[local];
    // A worker restarted alone starts its steps again: its old pace says nothing.
    if (t.firstReport < 0 || r.step < t.step) t = Track{.firstReport = now, .lastStep = now};
    if (r.step != t.step) t.lastStep = now;
    t.step = r.step;
    t.seen.emplace_back(now, r.step);
    while (t.seen.size() > 1 && t.seen[1].first <= now - kWindow) t.seen.pop_front();
    double rate = -1;
    const auto& [since, from] = t.seen.front();
    if (now - t.firstReport >= kSettle && now > since)
      rate = static_cast<double>(r.step - from) / (now - since);
    control::RankProgress rank{
        .rank = baseRank_ + static_cast<int>(local),
        .step = r.step,
        .epoch = r.epoch,
        .stepsPerSecond = rate,
        .sinceStep = now - t.lastStep,
        .loss = r.results & kReportedLoss ? std::optional(r.loss) : std::nullopt,
        .accuracy = r.results & kReportedAccuracy ? std::optional(r.accuracy) : std::nullopt,
        .samples = r.samples};
    if (local < metrics.size()) rank.metrics = metrics[local];
    out.ranks.push_back(std::move(rank));
  }
  return out;
}

bool progressChanged(const control::NodeProgress& last, const control::NodeProgress& next,
                     double refresh) {
  if (next.time - last.time >= refresh || last.round != next.round ||
      last.ranks.size() != next.ranks.size())
    return true;
  for (size_t i = 0; i < next.ranks.size(); ++i) {
    const auto& a = last.ranks[i];
    const auto& b = next.ranks[i];
    if (a.rank != b.rank || a.exited != b.exited || a.step != b.step || a.epoch != b.epoch ||
        a.loss != b.loss || a.accuracy != b.accuracy || a.metrics != b.metrics)
      return true;
  }
  return false;
}

}  // namespace dlrun::agents
