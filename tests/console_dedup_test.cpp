// Identical lines printed once (agents/console_dedup.h): the same line of several ranks within
// the window shown once with their ranks, lines that differ each shown, every rank's own order
// kept, nothing held past the window, long lines and floods never held, bytes shown as they are.
#include "agents/console_dedup.h"

#include <gtest/gtest.h>

namespace dlrun::agents {
namespace {

using namespace std::chrono_literals;

const Clock::time_point t0{};

// What the console shows, one string a line: "[ranks]:text" (stream 1 unless said).
std::vector<std::string> shown(const std::vector<GroupedLine>& lines) {
  std::vector<std::string> out;
  for (const auto& line : lines)
    out.push_back((line.stream == 2 ? "err " : "") + ranksPrefix(line.ranks) + line.text +
                  (line.newline ? "" : " (no newline)"));
  return out;
}

struct Console {
  LineGrouper grouper{LineGrouper::Limits{.window = 100ms}};
  std::vector<std::string> lines;

  void print(int rank, std::string_view text, Clock::duration at = 0ms, int stream = 1) {
    for (auto& line : shown(grouper.add(rank, stream, text, true, t0 + at))) lines.push_back(line);
  }
  void at(Clock::duration when) {
    for (auto& line : shown(grouper.due(t0 + when))) lines.push_back(line);
  }
};

TEST(RanksPrefix, RunsAreShortened) {
  EXPECT_EQ(ranksPrefix({5, 0, 1, 2, 3}), "[0-3,5]:");
  EXPECT_EQ(ranksPrefix({7}), "[7]:");
  EXPECT_EQ(ranksPrefix({1, 3, 4, 9, 10, 11, 1}), "[1,3-4,9-11]:");
}

TEST(LineGrouper, TheSameLineOfSeveralRanksIsShownOnce) {
  Console c;
  for (int rank = 0; rank < 8; ++rank) c.print(rank, "loading data", rank * 1ms);
  c.at(99ms);
  EXPECT_TRUE(c.lines.empty()) << "held for the window";
  c.at(100ms);
  EXPECT_EQ(c.lines, (std::vector<std::string>{"[0-7]:loading data"}));
  EXPECT_EQ(c.grouper.nextDue(), std::nullopt);
}

TEST(LineGrouper, LinesThatDifferAreEachShownAndStreamsApart) {
  Console c;
  c.print(0, "loss 0.5");
  c.print(1, "loss 0.7");
  c.print(2, "loss 0.5", 0ms, 2);  // the same text on stderr is another line
  c.at(100ms);
  EXPECT_EQ(c.lines,
            (std::vector<std::string>{"[0]:loss 0.5", "[1]:loss 0.7", "err [2]:loss 0.5"}));
}

TEST(LineGrouper, EachRanksOwnOrderIsKept) {
  Console c;
  c.print(0, "A");
  c.print(0, "B");
  c.print(1, "A");
  c.print(1, "D");
  c.print(1, "B");  // joins B, which moves after D
  c.print(2, "B");  // rank 2 printed nothing before: joins as it is
  c.print(2, "A");  // would come before its B: a line of its own
  c.at(100ms);
  EXPECT_EQ(c.lines, (std::vector<std::string>{"[0-1]:A", "[1]:D", "[0-2]:B", "[2]:A"}));
}

TEST(LineGrouper, AGroupOthersPrintedPastIsNotJoinedBackwards) {
  Console c;
  c.print(0, "A");
  c.print(0, "B");
  c.print(1, "B");
  c.print(1, "A");  // A came before B for rank 0, after it for rank 1: moving A would reorder 0
  c.at(100ms);
  EXPECT_EQ(c.lines, (std::vector<std::string>{"[0]:A", "[0-1]:B", "[1]:A"}));
}

TEST(LineGrouper, ARankRepeatingItsLineShowsItTwice) {
  Console c;
  c.print(0, "tick");
  c.print(0, "tick");
  c.at(100ms);
  EXPECT_EQ(c.lines, (std::vector<std::string>{"[0]:tick", "[0]:tick"}));
}

TEST(LineGrouper, NothingWaitsPastItsWindow) {
  Console c;
  c.print(0, "first", 0ms);
  c.print(1, "late", 60ms);
  c.print(0, "late", 70ms);  // after rank 0's "first": joins where it is
  c.at(100ms);
  EXPECT_EQ(c.lines, (std::vector<std::string>{"[0]:first"}));
  c.print(2, "first", 120ms);  // the window of the first is over: a line of its own
  c.at(160ms);
  EXPECT_EQ(c.lines, (std::vector<std::string>{"[0]:first", "[0-1]:late"}));
  c.at(220ms);
  EXPECT_EQ(c.lines.back(), "[2]:first");
}

TEST(LineGrouper, AMovedGroupIsShownByItsOwnWindow) {
  Console c;
  c.print(0, "A", 0ms);
  c.print(1, "B", 50ms);
  c.print(1, "A", 60ms);  // A moves behind B, whose window ends later
  c.at(100ms);            // A's window: A, and B before it, both shown
  EXPECT_EQ(c.lines, (std::vector<std::string>{"[1]:B", "[0-1]:A"}));
}

TEST(LineGrouper, ALongLineIsNeverHeld) {
  Console c;
  c.print(0, "short");
  const std::string longLine(5000, 'x');
  c.print(1, longLine);
  ASSERT_EQ(c.lines.size(), 2u) << "shown at once, after what was pending";
  EXPECT_EQ(c.lines[0], "[0]:short");
  EXPECT_EQ(c.lines[1], "[1]:" + longLine);
}

TEST(LineGrouper, BytesAreShownAsTheyAre) {
  Console c;
  const std::string binary("\x00\xff\x1b[31m\r\tend", 11);
  c.print(0, binary);
  c.print(1, binary);
  c.print(2, std::string("\x00\xfe", 2));
  c.at(100ms);
  EXPECT_EQ(c.lines,
            (std::vector<std::string>{"[0-1]:" + binary, "[2]:" + std::string("\x00\xfe", 2)}));
}

TEST(LineGrouper, AFloodOfDistinctLinesIsShownAsItComes) {
  LineGrouper grouper{{.window = 100ms, .maxPending = 3}};
  size_t shownAtOnce = 0;
  for (int i = 0; i < 10; ++i)
    shownAtOnce += grouper.add(0, 1, "line " + std::to_string(i), true, t0).size();
  EXPECT_EQ(shownAtOnce, 7u) << "no more than 3 held";
  EXPECT_EQ(shown(grouper.flush()),
            (std::vector<std::string>{"[0]:line 7", "[0]:line 8", "[0]:line 9"}));
  LineGrouper bytes{{.window = 100ms, .maxBytes = 10}};
  EXPECT_TRUE(bytes.add(0, 1, "12345", true, t0).empty());
  EXPECT_EQ(shown(bytes.add(0, 1, "678901", true, t0)), (std::vector<std::string>{"[0]:12345"}));
}

TEST(LineGrouper, AnEndedRanksLinesComeFirst) {
  Console c;
  c.print(0, "A");
  c.print(1, "B");
  c.print(0, "C");
  c.print(2, "D");
  EXPECT_EQ(shown(c.grouper.flushThrough(1)), (std::vector<std::string>{"[0]:A", "[1]:B"}));
  EXPECT_EQ(shown(c.grouper.flushThrough(1)), std::vector<std::string>{});
  c.at(100ms);
  EXPECT_EQ(c.lines, (std::vector<std::string>{"[0]:C", "[2]:D"}));
}

TEST(LineGrouper, AnUnterminatedLastLineStaysUnterminated) {
  LineGrouper grouper{{}};
  grouper.add(0, 1, "prompt> ", false, t0);
  grouper.add(1, 1, "prompt> ", true, t0);
  EXPECT_EQ(shown(grouper.flush()),
            (std::vector<std::string>{"[0]:prompt>  (no newline)", "[1]:prompt> "}));
}

}  // namespace
}  // namespace dlrun::agents
