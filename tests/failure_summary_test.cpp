// The first failure first (agents/failure_summary.h): the nodes' lists ordered by time, the
// counts, the caps on a node's list and a report, nodes that did not report, and garbled lists.
#include "agents/failure_summary.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"

namespace dlrun::agents {
namespace {

FailureRecord failure(int rank, const std::string& node, double time, const std::string& exit,
                      const std::string& report = "") {
  return {.rank = rank,
          .localRank = rank % 4,
          .node = node,
          .time = time,
          .exit = exit,
          .report = report};
}

NodeFailures node(const std::string& name, int baseRank, int workers) {
  return {.node = name, .baseRank = baseRank, .workers = workers};
}

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  for (size_t at = 0; at < text.size();) {
    const size_t nl = text.find('\n', at);
    out.push_back(text.substr(at, nl - at));
    at = nl == std::string::npos ? text.size() : nl + 1;
  }
  return out;
}

TEST(FailureSummaryTest, TheFirstInTimeComesFirstWhateverNodeReportedIt) {
  NodeFailures a = node("host1", 0, 4), b = node("host2", 4, 4);
  a.add(failure(2, "host1", 101.50, "exit code 4", "dlrun: worker failed: rank 2\n"));
  a.stopped = 3;
  b.add(failure(6, "host2", 100.00, "exit code 3",
                "dlrun: worker failed: rank 6 (local rank 2) on host2 ended with exit code 3\n"
                "dlrun: last lines of rank 6's stderr:\n"
                "dlrun:   ValueError: boom\n"));
  b.stopped = 3;
  const FailureSummary s = summarize({a, b}, {});
  ASSERT_TRUE(s.any);
  EXPECT_EQ(s.firstLine,
            "the job failed: rank 6 on host2 failed first (attempt 0, exit code 3); 1 other rank "
            "failed after it, 6 were stopped by dlrun");
  const auto l = lines(s.text);
  ASSERT_EQ(l.size(), 5u) << s.text;
  EXPECT_EQ(l[0], "dlrun: " + s.firstLine);
  EXPECT_EQ(l[1], "dlrun: worker failed: rank 6 (local rank 2) on host2 ended with exit code 3");
  EXPECT_EQ(l[3], "dlrun:   ValueError: boom");
  EXPECT_EQ(l[4], "dlrun:   then rank 2 on host1 (attempt 0): exit code 4, +1.50 s");
}

TEST(FailureSummaryTest, OthersAreShownInTimeOrderUpToALimitThenCounted) {
  NodeFailures n = node("h", 0, 16);
  for (int r = 0; r < 12; ++r) n.add(failure(r, "h", 10.0 + r, "signal SIGSEGV"));
  const FailureSummary s = summarize({n}, {});
  EXPECT_EQ(s.firstLine,
            "the job failed: rank 0 on h failed first (attempt 0, signal SIGSEGV); 11 other "
            "ranks failed after it");
  const auto l = lines(s.text);
  // The headline, the first's own line (no report kept: one made up), 8 others, the count.
  ASSERT_EQ(l.size(), 1u + 1u + kOthersShown + 1u) << s.text;
  EXPECT_EQ(l[1], "dlrun: worker failed: rank 0 (local rank 0) on h ended with signal SIGSEGV");
  for (size_t i = 0; i < kOthersShown; ++i)
    EXPECT_EQ(l[2 + i].rfind("dlrun:   then rank " + std::to_string(i + 1) + " on h", 0), 0u)
        << l[2 + i];
  EXPECT_EQ(l.back(), "dlrun:   ... and 3 more");
}

TEST(FailureSummaryTest, OneFailureAloneAndExitedRanksAreSaidSo) {
  NodeFailures n = node("", 0, 4);
  n.add(failure(1, "", 5, "exit code 3", "dlrun: worker failed: rank 1\n"));
  n.succeeded = 2;
  n.stopped = 1;
  const FailureSummary s = summarize({n}, {});
  EXPECT_EQ(s.firstLine,
            "the job failed: rank 1 failed first (attempt 0, exit code 3); no other rank failed, "
            "1 was stopped by dlrun, 2 had exited 0");
}

TEST(FailureSummaryTest, NoFailureAnywhereIsNothingToSay) {
  NodeFailures n = node("h", 0, 2);
  n.stopped = 2;
  const FailureSummary s = summarize({n}, {"10.0.0.3 (ranks 2-3)"});
  EXPECT_FALSE(s.any);
  EXPECT_TRUE(s.text.empty());
}

TEST(FailureSummaryTest, ANodesListKeepsItsFirstFailuresAndOnlyTheEarliestsReport) {
  NodeFailures n = node("h", 0, 64);
  for (int r = 0; r < 40; ++r)
    n.add(failure(r, "h", r, "exit code 1", "report of " + std::to_string(r)));
  ASSERT_EQ(n.failures.size(), NodeFailures::kListed);
  EXPECT_EQ(n.unlisted, 40 - static_cast<int>(NodeFailures::kListed));
  EXPECT_EQ(n.failed(), 40);
  EXPECT_EQ(n.failures[0].report, "report of 0");
  EXPECT_EQ(n.failures[1].report, "");
  const FailureSummary s = summarize({NodeFailures::decode(n.encode())}, {});
  EXPECT_NE(s.firstLine.find("39 other ranks failed after it"), std::string::npos) << s.firstLine;
  EXPECT_NE(s.text.find("dlrun:   ... and 31 more"), std::string::npos) << s.text;
}

TEST(FailureSummaryTest, ALongReportKeepsItsFirstLineAndItsEnd) {
  std::string report = "dlrun: worker failed: rank 0 ended with exit code 1\n";
  for (int i = 0; i < 2000; ++i) report += "dlrun:   line " + std::to_string(i) + "\n";
  const std::string cut = capReport(report, NodeFailures::kReportBytes);
  EXPECT_LE(cut.size(), NodeFailures::kReportBytes);
  EXPECT_EQ(cut.rfind("dlrun: worker failed: rank 0 ended with exit code 1\n", 0), 0u);
  EXPECT_NE(cut.find("dlrun:   ... (cut)\n"), std::string::npos);
  EXPECT_TRUE(cut.ends_with("dlrun:   line 1999\n"));
  // Whole lines only, after the cut.
  const size_t after = cut.find("(cut)\n") + 6;
  EXPECT_EQ(cut.compare(after, 13, "dlrun:   line"), 0) << cut.substr(after, 40);
  EXPECT_EQ(capReport("short\n", 100), "short\n");
}

TEST(FailureSummaryTest, TheCodecKeepsEveryField) {
  NodeFailures n = node("host (10.0.0.2)", 8, 4);
  n.stopped = 2;
  n.succeeded = 1;
  n.add({.rank = 9,
         .localRank = 1,
         .node = "host (10.0.0.2)",
         .attempt = 2,
         .time = 1.25,
         .exit = "signal SIGKILL",
         .report = "dlrun: r\n"});
  const NodeFailures back = NodeFailures::decode(n.encode());
  EXPECT_EQ(back.node, n.node);
  EXPECT_EQ(back.baseRank, 8);
  EXPECT_EQ(back.workers, 4);
  EXPECT_EQ(back.stopped, 2);
  EXPECT_EQ(back.succeeded, 1);
  ASSERT_EQ(back.failures.size(), 1u);
  EXPECT_EQ(back.failures[0].rank, 9);
  EXPECT_EQ(back.failures[0].localRank, 1);
  EXPECT_EQ(back.failures[0].attempt, 2);
  EXPECT_DOUBLE_EQ(back.failures[0].time, 1.25);
  EXPECT_EQ(back.failures[0].exit, "signal SIGKILL");
  EXPECT_EQ(back.failures[0].report, "dlrun: r\n");
}

TEST(FailureSummaryTest, AWorkersBytesThatAreNotUtf8StillEncode) {
  NodeFailures n = node("h", 0, 1);
  n.add(failure(0, "h", 1, "exit code 1", "dlrun:   \xff\xfe bad bytes\n"));
  const NodeFailures back = NodeFailures::decode(n.encode());
  ASSERT_EQ(back.failures.size(), 1u);
  EXPECT_NE(back.failures[0].report.find("bad bytes"), std::string::npos);
}

TEST(FailureSummaryTest, GarbledListsAreRefusedWithAClearError) {
  for (const std::string text :
       {"", "nonsense", "[1,2]", "{}", R"({"node":"h"})",
        R"({"node":"h","base_rank":0,"workers":1,"stopped":0,"succeeded":0,"unlisted":0})",
        R"({"node":"h","base_rank":0,"workers":1,"stopped":0,"succeeded":0,"unlisted":0,)"
        R"("failures":[7]})",
        R"({"node":"h","base_rank":0,"workers":-1,"stopped":0,"succeeded":0,"unlisted":0,)"
        R"("failures":[]})",
        R"({"node":5,"base_rank":0,"workers":1,"stopped":0,"succeeded":0,"unlisted":0,)"
        R"("failures":[]})",
        R"({"node":"h","base_rank":0,"workers":1,"stopped":0,"succeeded":0,"unlisted":0,)"
        R"("failures":[{"rank":"x"}]})"}) {
    try {
      NodeFailures::decode(text);
      ADD_FAILURE() << "decoded: " << text;
    } catch (const ProtocolError& e) {
      EXPECT_NE(std::string(e.what()).find("a node's failed workers"), std::string::npos)
          << e.what();
    }
  }
}

TEST(FailureSummaryTest, NodesThatDidNotReportAreNamedByTheirRanksHost) {
  const std::vector<std::string> endpoints = {"10.0.0.1:1", "10.0.0.1:2", "10.0.0.2:1",
                                              "10.0.0.2:2", "[::1]:5",    "[::1]:6"};
  NodeFailures first = node("a", 0, 2);
  EXPECT_EQ(unreported({first}, endpoints),
            (std::vector<std::string>{"10.0.0.2 (ranks 2-3)", "::1 (ranks 4-5)"}));
  EXPECT_TRUE(unreported({first, node("b", 2, 2), node("c", 4, 2)}, endpoints).empty());
  // A list whose ranks lie outside the round's (garbled, or another round's) covers nothing.
  EXPECT_EQ(unreported({node("x", 100, 4)}, endpoints).size(), 3u);
  NodeFailures one = node("a", 0, 2);
  one.add(failure(0, "a", 1, "exit code 2"));
  const FailureSummary s = summarize({one}, unreported({one}, {"h1:1", "h1:2", "h2:1"}));
  EXPECT_TRUE(s.text.ends_with("dlrun: node h2 (rank 2) did not report its workers\n")) << s.text;
}

TEST(FailureSummaryTest, APrefaceBeforeTheWorkersReportIsKept) {
  EXPECT_EQ(reportPreface("dlrun: a crash loop: ...\ndlrun: worker failed: rank 0\n"),
            "dlrun: a crash loop: ...\n");
  EXPECT_EQ(reportPreface("dlrun: worker failed: rank 0\n"), "");
  EXPECT_EQ(reportPreface("dlrun: hang: rank 3\n"), "");
}

}  // namespace
}  // namespace dlrun::agents
