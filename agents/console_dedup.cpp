#include "agents/console_dedup.h"

#include <algorithm>

#include "agents/output.h"
#include "common/asio.h"

namespace dlrun::agents {

namespace asio = boost::asio;

std::string ranksPrefix(std::vector<int> ranks) {
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  std::string out = "[";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ',';
    out += std::to_string(ranks[i]);
    if (j > i) out += '-' + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out + "]:";
}

bool LineGrouper::canJoin(int rank, const Group& group) const {
  const auto last = lastOfRank_.find(rank);
  if (last == lastOfRank_.end() || last->second->order < group.order) return true;
  if (&*last->second == &group) return false;  // its own last line again: a line of its own
  // Moved to the end, after the rank's last line, it must not pass a later line of a member.
  for (int member : group.line.ranks) {
    const auto theirs = lastOfRank_.find(member);
    if (theirs == lastOfRank_.end() || &*theirs->second != &group) return false;
  }
  return true;
}

std::vector<GroupedLine> LineGrouper::add(int rank, int stream, std::string_view text, bool newline,
                                          Clock::time_point now) {
  std::vector<GroupedLine> out;
  if (text.size() > limits_.maxLine) {
    out = flush();  // what came before it, then it
    out.push_back({{rank}, stream, std::string(text), newline});
    return out;
  }
  const auto newest = newest_.find(Key{stream, newline, text});
  if (newest != newest_.end() && canJoin(rank, *newest->second)) {
    const Pending::iterator group = newest->second;
    const auto last = lastOfRank_.find(rank);
    if (last != lastOfRank_.end() && last->second->order > group->order) {
      group->order = nextOrder_++;
      pending_.splice(pending_.end(), pending_, group);
    }
    group->line.ranks.push_back(rank);
    lastOfRank_[rank] = group;
    return out;
  }
  pending_.push_back({{{rank}, stream, std::string(text), newline}, {}, nextOrder_++});
  const auto group = std::prev(pending_.end());
  // Windows end in the order groups begin: the hint makes the insertion O(1).
  group->due = dues_.emplace_hint(dues_.end(), now + limits_.window, group);
  // Keyed by this group's own copy of the text: an older group's key would outlive its text.
  if (newest != newest_.end()) newest_.erase(newest);
  newest_.emplace(keyOf(group->line), group);
  lastOfRank_[rank] = group;
  bytes_ += text.size();
  while (pending_.size() > limits_.maxPending || bytes_ > limits_.maxBytes)
    popThrough(pending_.begin(), out);
  return out;
}

void LineGrouper::popThrough(Pending::iterator last, std::vector<GroupedLine>& out) {
  for (bool done = false; !done;) {
    done = pending_.begin() == last;
    Group& group = pending_.front();
    const auto newest = newest_.find(keyOf(group.line));
    if (newest != newest_.end() && newest->second == pending_.begin()) newest_.erase(newest);
    for (int rank : group.line.ranks) {
      const auto mine = lastOfRank_.find(rank);
      if (mine != lastOfRank_.end() && mine->second == pending_.begin()) lastOfRank_.erase(mine);
    }
    dues_.erase(group.due);
    bytes_ -= group.line.text.size();
    out.push_back(std::move(group.line));
    pending_.pop_front();
  }
}

std::vector<GroupedLine> LineGrouper::due(Clock::time_point now) {
  std::vector<GroupedLine> out;
  // The last group whose window ended, and every group before it: a group moved behind
  // younger ones is not held past its window.
  auto last = pending_.end();
  for (auto it = dues_.begin(); it != dues_.end() && it->first <= now; ++it)
    if (last == pending_.end() || it->second->order > last->order) last = it->second;
  if (last != pending_.end()) popThrough(last, out);
  return out;
}

std::vector<GroupedLine> LineGrouper::flush() {
  std::vector<GroupedLine> out;
  if (!pending_.empty()) popThrough(std::prev(pending_.end()), out);
  return out;
}

std::vector<GroupedLine> LineGrouper::flushThrough(int rank) {
  std::vector<GroupedLine> out;
  const auto last = lastOfRank_.find(rank);
  if (last != lastOfRank_.end()) popThrough(last->second, out);
  return out;
}

std::optional<Clock::time_point> LineGrouper::nextDue() const {
  if (dues_.empty()) return std::nullopt;
  return dues_.begin()->first;
}

struct ConsoleDedup::Impl : std::enable_shared_from_this<Impl> {
  Impl(asio::io_context& io, LineGrouper::Limits limits)
      : grouper(limits), timer(io), early(limits.window / 10) {}

  void show(const std::vector<GroupedLine>& lines) {
    for (const auto& line : lines) {
      std::string out = ranksPrefix(line.ranks);
      out += line.text;
      if (line.newline) out += '\n';
      writeAll(line.stream, out);  // one write a line: the ranks' lines never interleave
    }
  }

  // The timer set for the oldest pending group, where it is not already.
  void arm() {
    const auto next = grouper.nextDue();
    // One set earlier stays: it looks again when it fires (a flood must not re-arm every line).
    if (!next || (armed && *armed <= *next)) return;
    armed = next;
    timer.expires_at(*next);
    timer.async_wait([weak = weak_from_this()](const boost::system::error_code& ec) {
      const auto self = weak.lock();
      if (ec || !self) return;
      self->armed.reset();
      // What falls due within a tenth of the window goes now, a little early: when every line
      // differs, each is a group of its own, and the loop would wake for each one.
      self->show(self->grouper.due(Clock::now() + self->early));
      self->arm();
    });
  }

  LineGrouper grouper;
  asio::steady_timer timer;
  std::optional<Clock::time_point> armed;
  const Clock::duration early;
};

ConsoleDedup::ConsoleDedup(asio::io_context& io, LineGrouper::Limits limits)
    : impl_(std::make_shared<Impl>(io, limits)) {}

ConsoleDedup::~ConsoleDedup() {
  impl_->timer.cancel();
  flush();
}

void ConsoleDedup::flush() { impl_->show(impl_->grouper.flush()); }

void ConsoleDedup::add(int rank, int stream, std::string_view text, bool newline) {
  impl_->show(impl_->grouper.add(rank, stream, text, newline, Clock::now()));
  impl_->arm();
}

void ConsoleDedup::flushThrough(int rank) { impl_->show(impl_->grouper.flushThrough(rank)); }

}  // namespace dlrun::agents
