// `dlrun logs`'s records in the store (control/state/log_mailbox.h): requests and chunks read back
// as written, any byte of a line included; anything else is a ProtocolError, never a crash; the
// job-wide view's merge shows each shared line once per occurrence, with its ranks and nodes.
#include "control/state/log_mailbox.h"

#include <gtest/gtest.h>

#include "common/error.h"
#include "control/state/control_state.h"

namespace dlrun::control {
namespace {

LogLine line(std::string text, std::vector<int> ranks, std::vector<std::string> nodes = {},
             bool err = false) {
  return {
      .text = std::move(text), .ranks = std::move(ranks), .nodes = std::move(nodes), .err = err};
}

std::vector<std::string> texts(const std::vector<LogLine>& lines) {
  std::vector<std::string> out;
  for (const auto& l : lines) out.push_back(l.text);
  return out;
}

TEST(LogMailbox, KeysLiveBesideTheCommands) {
  const LogKeys keys("job7");
  EXPECT_EQ(keys.count(), "dlrun/job7/ctl/logs");
  EXPECT_EQ(keys.request(3), "dlrun/job7/ctl/log/3");
  EXPECT_EQ(keys.chunk(3, 2, 0), "dlrun/job7/ctl/log/3/2/0");
  const auto command =
      decodeCommand(encodeCommand({.kind = ControlCommand::Kind::Logs, .value = 3}));
  ASSERT_TRUE(command);
  EXPECT_EQ(command->kind, ControlCommand::Kind::Logs);
  EXPECT_EQ(command->value, 3);
  EXPECT_FALSE(decodeCommand("logs:0"));
  EXPECT_FALSE(decodeCommand("logs:x"));
}

TEST(LogMailbox, ARequestRoundTrips) {
  const LogRequest asked{.rank = 5,
                         .node = "node1",
                         .attempt = 2,
                         .streams = LogStreams::Err,
                         .follow = true,
                         .tail = 10,
                         .grep = "loss",
                         .grouped = false};
  const LogRequest r = decodeLogRequest(encode(asked));
  EXPECT_EQ(r.rank, 5);
  EXPECT_EQ(r.node, "node1");
  EXPECT_EQ(r.attempt, 2);
  EXPECT_EQ(r.streams, LogStreams::Err);
  EXPECT_TRUE(r.follow);
  EXPECT_EQ(r.tail, 10);
  EXPECT_EQ(r.grep, "loss");
  EXPECT_THROW(decodeLogRequest("{}"), ProtocolError);
  EXPECT_THROW(decodeLogRequest("not json"), ProtocolError);
  std::string bad = encode(asked);
  bad.replace(bad.find("\"err\""), 5, "\"all\"");
  EXPECT_THROW(decodeLogRequest(bad), ProtocolError);
}

TEST(LogMailbox, AChunkKeepsEveryByteOfItsLines) {
  const std::string binary("a\0b\xff,9:\n", 8);
  LogChunk chunk{.kind = LogChunk::Kind::End, .attempt = 4, .detail = "done, 3:x"};
  chunk.lines = {line(binary, {0, 1, 7}, {"n1", "n2"}, true), line("", {3})};
  chunk.lines[0].count = 6;
  const LogChunk c = decodeLogChunk(encode(chunk));
  EXPECT_EQ(c.kind, LogChunk::Kind::End);
  EXPECT_EQ(c.attempt, 4);
  EXPECT_EQ(c.detail, "done, 3:x");
  ASSERT_EQ(c.lines.size(), 2u);
  EXPECT_EQ(c.lines[0].text, binary);
  EXPECT_EQ(c.lines[0].ranks, (std::vector<int>{0, 1, 7}));
  EXPECT_EQ(c.lines[0].nodes, (std::vector<std::string>{"n1", "n2"}));
  EXPECT_TRUE(c.lines[0].err);
  EXPECT_EQ(c.lines[0].count, 6);
  EXPECT_EQ(c.lines[1].text, "");
  EXPECT_TRUE(c.lines[1].nodes.empty());
}

TEST(LogMailbox, BytesThatAreNoChunkAreAProtocolError) {
  const std::string good = encode(LogChunk{.lines = {line("hello", {1})}});
  for (size_t cut = 0; cut < good.size(); ++cut)
    EXPECT_THROW(decodeLogChunk(good.substr(0, cut)), ProtocolError) << cut;
  for (const std::string bad :
       {"", "dlrun-log,", "dlrun-log,1:9,", "dlrun-log,99999999999:0,",
        "dlrun-log,1:0,2:-1,0:,1:1,1:x,1:1,0:,0:,0:,", "dlrun-log,1:0,1:0,0:,1:0,1:o,"})
    EXPECT_THROW(decodeLogChunk(bad), ProtocolError) << bad;
}

TEST(LogMailbox, TheMergeShowsEachSharedLineOncePerOccurrence) {
  // Three ranks print the same lines; rank 2 one of its own; rank 0 a line twice.
  const std::vector<std::vector<LogLine>> ranks{
      {line("start", {0}), line("step", {0}), line("step", {0}), line("end", {0})},
      {line("start", {1}), line("step", {1}), line("end", {1})},
      {line("start", {2}), line("only mine", {2}), line("step", {2}), line("end", {2})},
  };
  const auto merged = mergeLines(ranks);
  EXPECT_EQ(texts(merged), (std::vector<std::string>{"start", "step", "only mine", "step", "end"}));
  EXPECT_EQ(merged[0].ranks, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(merged[1].ranks, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(merged[3].ranks, (std::vector<int>{0}));  // rank 0's second "step"
  EXPECT_EQ(merged[4].count, 3);
}

TEST(LogMailbox, NodesMergeIntoOneViewAndStreamsStayApart) {
  const std::vector<std::vector<LogLine>> nodes{
      {line("warn", {0, 1}, {"a"}), line("warn", {0}, {"a"}, true)},
      {line("warn", {2, 3}, {"b"})},
  };
  const auto merged = mergeLines(nodes);
  ASSERT_EQ(merged.size(), 2u);
  EXPECT_EQ(merged[0].ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(merged[0].nodes, (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(merged[0].err);
  EXPECT_TRUE(merged[1].err);
  EXPECT_EQ(merged[1].nodes, (std::vector<std::string>{"a"}));
}

}  // namespace
}  // namespace dlrun::control
