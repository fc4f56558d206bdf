// Identical lines printed once (docs/guides/watching-and-stopping.md): when several ranks of a
// node print the same line within a short window, the console shows it once with their ranks,
// "[0-7]: line". Lines that differ are shown as before, each rank's own order kept, none held
// longer than the window; a line seen once is always shown. On by default from 8 workers on a
// node (--console-dedup), never under --console-format=torchrun or a prefix template of the
// user's: the ranks' list is dlrun's own prefix.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/clock.h"

namespace boost::asio {
class io_context;
}

namespace dlrun::agents {

// A line as the console shows it: the ranks that printed it, on one stream.
struct GroupedLine {
  std::vector<int> ranks;  // in the order they printed it
  int stream = 1;          // the console's descriptor: STDOUT_FILENO or STDERR_FILENO
  std::string text;        // without its newline
  bool newline = true;
};

// "[0-3,5]:" for ranks 5, 0, 1, 2, 3 (pure).
std::string ranksPrefix(std::vector<int> ranks);

// The grouping itself (pure: the caller says what time it is). The console shows the groups in
// an order that keeps each rank's own: a line joins the newest pending group of the same text
// on the same stream where that group comes after the rank's last line, or where no member of
// the group printed anything since (the group then moves to the end); otherwise it starts a
// group. A group is shown once its window, from its first line, ends, with every group before it.
class LineGrouper {
 public:
  struct Limits {
    std::chrono::milliseconds window{100};
    size_t maxLine = 4096;      // a longer line is never held: shown at once, after the pending
    size_t maxPending = 4096;   // groups, and their bytes: a flood of distinct lines is shown
    size_t maxBytes = 4 << 20;  // as it comes, the oldest first, never piled up
  };
  explicit LineGrouper(Limits limits) : limits_(limits) {
    // Sparse buckets: most lines of a flood are new, and a miss then reads a node or none.
    newest_.max_load_factor(0.25f);
  }

  // Adds a rank's line at `now`; returns what must be shown at once (in order).
  std::vector<GroupedLine> add(int rank, int stream, std::string_view text, bool newline,
                               Clock::time_point now);
  // The groups whose window ended by `now`, in order.
  std::vector<GroupedLine> due(Clock::time_point now);
  // Every pending group, in order (the agent ends).
  std::vector<GroupedLine> flush();
  // The pending groups up to the one of `rank`'s last line, in order (the rank's worker ended:
  // its lines come before what is said of its end; the others' still wait for company).
  std::vector<GroupedLine> flushThrough(int rank);
  // When the first pending group's window ends; nothing when none is pending.
  std::optional<Clock::time_point> nextDue() const;

 private:
  struct Group;
  using Pending = std::list<Group>;  // in console order
  // The pending groups by when their windows end: due() visits only the groups that are due.
  using Dues = std::multimap<Clock::time_point, Pending::iterator>;
  struct Group {
    GroupedLine line;
    Dues::iterator due;
    uint64_t order = 0;  // its place on the console: after every group of a smaller one
  };
  // Shows the pending groups up to and with `last`.
  void popThrough(Pending::iterator last, std::vector<GroupedLine>& out);
  bool canJoin(int rank, const Group& group) const;
  // A text on its stream; `text` views the group's own copy (list nodes never move), so a
  // line is looked up without a copy of its own.
  struct Key {
    int stream;
    bool newline;
    std::string_view text;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& key) const {
      return std::hash<std::string_view>()(key.text) ^
             static_cast<size_t>(key.stream * 2 + key.newline);
    }
  };
  static Key keyOf(const GroupedLine& line) { return {line.stream, line.newline, line.text}; }

  Limits limits_;
  Pending pending_;
  uint64_t nextOrder_ = 0;
  size_t bytes_ = 0;
  Dues dues_;
  std::unordered_map<Key, Pending::iterator, KeyHash> newest_;  // a text's newest pending group
  std::unordered_map<int, Pending::iterator> lastOfRank_;       // a rank's last line's, pending
};

// The node's console behind a LineGrouper, on the agent's loop: its window ends on a timer.
class ConsoleDedup {
 public:
  ConsoleDedup(boost::asio::io_context& io, LineGrouper::Limits limits);
  ~ConsoleDedup();  // shows what is pending
  ConsoleDedup(const ConsoleDedup&) = delete;
  ConsoleDedup& operator=(const ConsoleDedup&) = delete;

  void add(int rank, int stream, std::string_view text, bool newline);
  void flushThrough(int rank);  // LineGrouper::flushThrough, shown
  void flush();                 // every pending group, shown

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace dlrun::agents
