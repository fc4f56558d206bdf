// Worker output: LineSplitter cutting byte streams into lines, expandPrefix, and a StreamPump
// moving a pipe's bytes to a console (prefixed lines), a log file (raw bytes) and the kept tail.
#include "agents/output.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/asio.h"

namespace dlrun::agents {
namespace {

using Lines = std::vector<std::string>;

// Feeds each chunk in turn, then finishes; returns every emitted line.
Lines split(const std::vector<std::string>& chunks, size_t maxLine = 64 * 1024) {
  LineSplitter splitter(maxLine);
  Lines lines;
  auto emit = [&](std::string_view line) { lines.emplace_back(line); };
  for (const auto& chunk : chunks) splitter.feed(chunk, emit);
  splitter.finish(emit);
  return lines;
}

TEST(LineSplitter, CompleteLines) { EXPECT_EQ(split({"a\nbb\nccc\n"}), (Lines{"a", "bb", "ccc"})); }

TEST(LineSplitter, LinesAcrossChunks) {
  EXPECT_EQ(split({"he", "llo\nwo", "rld", "\n"}), (Lines{"hello", "world"}));
  EXPECT_EQ(split({"x", "\n", "\n", "y\n"}), (Lines{"x", "", "y"}));
}

TEST(LineSplitter, EmptyLinesAreKept) { EXPECT_EQ(split({"\n\na\n\n"}), (Lines{"", "", "a", ""})); }

TEST(LineSplitter, UnterminatedRestComesOutOnFinish) {
  LineSplitter splitter;
  Lines lines;
  auto emit = [&](std::string_view line) { lines.emplace_back(line); };
  splitter.feed("done\npartial", emit);
  EXPECT_EQ(lines, Lines{"done"});
  splitter.finish(emit);
  EXPECT_EQ(lines, (Lines{"done", "partial"}));
  splitter.finish(emit);  // nothing left the second time
  EXPECT_EQ(lines, (Lines{"done", "partial"}));
}

TEST(LineSplitter, NothingInNothingOut) {
  EXPECT_EQ(split({}), Lines{});
  EXPECT_EQ(split({"", ""}), Lines{});
}

TEST(LineSplitter, NoBytesAreLostOrAdded) {
  std::string input;
  for (int i = 0; i < 1000; ++i) input += std::string(i % 37, 'a' + i % 26) + "\n";
  std::vector<std::string> chunks;
  for (size_t at = 0; at < input.size(); at += 13) chunks.push_back(input.substr(at, 13));
  std::string joined;
  for (const auto& line : split(chunks)) joined += line + "\n";
  EXPECT_EQ(joined, input);
}

// The header's promise: a line longer than the limit is passed on in pieces.
TEST(LineSplitter, LongLineInPiecesWithinTheLimit) {
  const std::string longLine(100, 'x');
  for (const auto& chunks : {std::vector<std::string>{longLine + "\nend\n"},
                             std::vector<std::string>{longLine, "\nend\n"}}) {
    const Lines lines = split(chunks, 16);
    ASSERT_GE(lines.size(), 2u);
    EXPECT_EQ(lines.back(), "end");
    std::string joined;
    for (size_t i = 0; i + 1 < lines.size(); ++i) {
      EXPECT_LE(lines[i].size(), 16u) << "piece " << i;
      joined += lines[i];
    }
    EXPECT_EQ(joined, longLine);
  }
}

// A long line flushed in pieces and then ended by a newline at the start of the next chunk is
// still one line: the newline must not produce an extra empty line.
TEST(LineSplitter, LongLineEndingAtAChunkBoundaryAddsNoEmptyLine) {
  const std::string longLine(20, 'x');
  const Lines lines = split({longLine, "\nend\n"}, 16);
  std::string joined;
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    EXPECT_FALSE(lines[i].empty()) << "empty piece " << i << " of " << lines.size();
    joined += lines[i];
  }
  EXPECT_EQ(joined, longLine);
  EXPECT_EQ(lines.back(), "end");
}

TEST(ExpandPrefix, Placeholders) {
  EXPECT_EQ(expandPrefix("[${rank}]:", 3, 1, "default"), "[3]:");
  EXPECT_EQ(expandPrefix("[${role_name}${local_rank}]:", 3, 1, "trainer"), "[trainer1]:");
  EXPECT_EQ(expandPrefix("${rank}/${rank} ", 12, 0, "r"), "12/12 ");
  EXPECT_EQ(expandPrefix("no placeholders", 1, 1, "r"), "no placeholders");
  EXPECT_EQ(expandPrefix("", 1, 1, "r"), "");
  EXPECT_EQ(expandPrefix("${unknown} ${rank", 1, 1, "r"), "${unknown} ${rank");
}

TEST(ExpandPrefix, SubstitutedTextIsNotExpandedAgain) {
  EXPECT_EQ(expandPrefix("${role_name}:", 5, 2, "${rank}"), "${rank}:");
}

// Each expectation is what Python reads back from the bytes in text mode with errors="replace"
// (torchrun's tail of a teed stream): the text, then whether the last line ended.
TEST(AsPythonText, LineEndsAndBadUtf8AsPythonReadsThem) {
  struct Case {
    std::string line;
    bool ended;
    std::string text;
    bool endedAfter;
  };
  const std::string fffd = "\xEF\xBF\xBD";
  for (const Case& c : std::vector<Case>{
           {"plain", true, "plain", true},
           {"no end", false, "no end", false},
           {"crlf\r", true, "crlf", true},
           {"cr at the end\r", false, "cr at the end", true},
           {"a\rb", true, "a\nb", true},
           {"a\r\r", true, "a\n", true},
           {"\xff\xfe", true, fffd + fffd, true},
           {"\xe2\x82", false, fffd, false},  // a truncated sequence: one U+FFFD
           {"\xe2\x82"
            "a",
            true, fffd + "a", true},
           {"\xed\xa0\x80", true, fffd + fffd + fffd, true},  // a surrogate: ill-formed
           {"\xf0\x9f\x98\x80 \xc3\xa9", true, "\xf0\x9f\x98\x80 \xc3\xa9", true},
           {"\xc0\xaf", true, fffd + fffd, true},                        // an overlong form
           {"\xf4\x90\x80\x80", true, fffd + fffd + fffd + fffd, true},  // past U+10FFFF
       }) {
    SCOPED_TRACE(c.line);
    bool ended = c.ended;
    EXPECT_EQ(asPythonText(c.line, ended), c.text);
    EXPECT_EQ(ended, c.endedAfter);
  }
}

// --- StreamPump --------------------------------------------------------------------------

struct Pipe {
  int read = -1, write = -1;
  Pipe() {
    int fds[2];
    EXPECT_EQ(::pipe2(fds, O_CLOEXEC), 0);
    read = fds[0];
    write = fds[1];
  }
  void closeWrite() {
    if (write >= 0) ::close(write);
    write = -1;
  }
};

std::string readAll(int fd) {
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = ::read(fd, buffer, sizeof buffer)) > 0) out.append(buffer, static_cast<size_t>(n));
  return out;
}

void writeAll(int fd, const std::string& text) {
  ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
}

TEST(StreamPump, ConsoleFileAndTail) {
  boost::asio::io_context io;
  Pipe worker, console;
  FILE* log = std::tmpfile();
  ASSERT_NE(log, nullptr);
  OutputTarget target;
  target.consoleFd = console.write;
  target.prefix = "[7]:";
  target.fileFd = ::dup(::fileno(log));  // the pump closes its copy
  target.keepLines = 2;
  {
    StreamPump pump(io, worker.read, target);
    pump.start();
    writeAll(worker.write, "one\ntwo\nthree\nunterminated");
    worker.closeWrite();
    io.run();  // reads until end of file
    EXPECT_EQ(pump.lastLines(), (std::deque<std::string>{"three", "unterminated"}));
  }
  console.closeWrite();
  EXPECT_EQ(readAll(console.read), "[7]:one\n[7]:two\n[7]:three\n[7]:unterminated\n");
  ::lseek(::fileno(log), 0, SEEK_SET);
  EXPECT_EQ(readAll(::fileno(log)), "one\ntwo\nthree\nunterminated");
  ::close(console.read);
  std::fclose(log);
}

TEST(StreamPump, DrainReadsWhatIsThereWithoutWaitingForEndOfFile) {
  boost::asio::io_context io;
  Pipe worker, console;
  OutputTarget target;
  target.consoleFd = console.write;
  target.prefix = "> ";
  StreamPump pump(io, worker.read, target);
  pump.start();
  writeAll(worker.write, "left\nbehind");
  // The write end stays open, as when a worker's child still holds it: drain must not block.
  pump.drain();
  console.closeWrite();
  EXPECT_EQ(readAll(console.read), "> left\n> behind\n");
  worker.closeWrite();
  ::close(console.read);
}

TEST(StreamPump, HiddenStreamStillKeepsItsTail) {
  boost::asio::io_context io;
  Pipe worker;
  OutputTarget target;  // no console, no file
  target.keepLines = 1;
  StreamPump pump(io, worker.read, target);
  pump.start();
  writeAll(worker.write, "a\nb\n");
  worker.closeWrite();
  io.run();
  EXPECT_EQ(pump.lastLines(), std::deque<std::string>{"b"});
}

}  // namespace
}  // namespace dlrun::agents
