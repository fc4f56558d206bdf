// dlrun.checkpoint's copies sent to a peer node's agent (agents/checkpoint_peer.h) over the wire
// of agents/checkpoint_wire.h: the checksum the agent computes is the worker's own, a copy is
// kept only whole and checked, a rank's two newest stay, a held copy is sent back on request,
// and every bad request or failed send is one line.
#include "agents/checkpoint_peer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "agents/checkpoint_files.h"
#include "agents/checkpoint_wire.h"
#include "common/error.h"
#include "store/tcp_stream.h"

namespace dlrun::agents {
namespace {

namespace fs = std::filesystem;

std::string pattern(size_t bytes, int seed) {
  std::string data(bytes, '\0');
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>((i * 7 + 3 + seed) % 256);
  return data;
}

std::string checksumOf(const std::string& tensors, const std::string& meta) {
  CopyChecksum checksum;
  checksum.addTensors(tensors.data(), tensors.size());
  checksum.setMeta(meta);
  return checksum.text();
}

TEST(CheckpointWire, TheChecksumIsTheWorkersOwn) {
  // python/dlrun/checkpoint.py's _checksum of the same bytes, computed by torch.
  EXPECT_EQ(checksumOf(pattern(3 * 4096, 0), "structure"),
            "090f14eaf0f6fa00121e29d5e1edf4006f0137ea");
}

TEST(CheckpointWire, RequestsAndAnswersReadBackAsWritten) {
  const CopyHeader copy{.metaBytes = 9, .tensorBytes = 8192, .checksum = std::string(40, 'a')};
  const std::string put = putLine(3, 12, copy);
  EXPECT_EQ(parseRequest(std::string_view(put).substr(0, put.size() - 1)),
            (PeerRequest{.put = true, .rank = 3, .step = 12, .copy = copy}));
  EXPECT_EQ(parseRequest("GET 3 12"), (PeerRequest{.rank = 3, .step = 12}));
  const std::string have = haveLine(copy);
  EXPECT_EQ(parseAnswer(std::string_view(have).substr(0, have.size() - 1)), copy);
  EXPECT_EQ(parseAnswer("OK"), std::nullopt);
  EXPECT_EQ(noLine("two\nlines"), "NO two lines\n");
  try {
    parseAnswer("NO no copy here");
    FAIL() << "a refusal read as an answer";
  } catch (const ProtocolError&) {
    FAIL() << "a refusal read as bad bytes";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "no copy here");
  }
}

TEST(CheckpointWire, BadLinesAreNamed) {
  const std::string sum(40, 'a');
  for (const std::string& line : std::vector<std::string>{
           "", "HELLO", "GET 1", "GET -1 2", "GET 1 x", "DEL 1 2", "PUT 1 2 3 4096",
           "PUT 1 2 3 4097 " + sum, "PUT 1 2 3 0 " + sum, "PUT 1 2 3 4096 " + sum.substr(1),
           "PUT 1 2 3 4096 " + std::string(40, 'G'), "PUT 1 2 2000000000 4096 " + sum})
    EXPECT_THROW(parseRequest(line), ProtocolError) << line;
  EXPECT_THROW(parseAnswer("HAVE 1 2"), ProtocolError);
  EXPECT_THROW(parseAnswer("YES"), ProtocolError);
}

class CheckpointPeers : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = fs::temp_directory_path() / ("checkpoint_peer_test." + std::to_string(::getpid()));
    fs::create_directories(base_ / "a");
    fs::create_directories(base_ / "b");
    peer_.emplace(base_ / "b", "127.0.0.1");
  }
  void TearDown() override {
    peer_.reset();
    fs::remove_all(base_);
  }

  // Rank `rank`'s copy of `step` in a's memory, slot 0, asked to be sent to b (its checksum
  // `checksum` where given, else the copy's own).
  fs::path copy(int rank, int64_t step, std::optional<std::string> checksum = std::nullopt) {
    const fs::path slot = base_ / "a" / ("rank-" + std::to_string(rank)) / "slot-0";
    fs::create_directories(slot);
    const std::string tensors = pattern(2 * 4096, static_cast<int>(step)), meta = "meta";
    std::ofstream(slot / "tensors", std::ios::binary) << tensors;
    std::ofstream(slot / "meta", std::ios::binary) << meta;
    std::ofstream(slot / "step") << step << ' ' << checksum.value_or(checksumOf(tensors, meta))
                                 << '\n';
    std::ofstream(slot / "replicate") << step << ' ' << peer_->address() << '\n';
    return slot;
  }

  fs::path held(int rank, int64_t step) const {
    return base_ / "b" / "peer" / ("rank-" + std::to_string(rank)) /
           ("step-" + std::to_string(step));
  }

  static std::string read(const fs::path& file) {
    std::ifstream in(file, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }

  // What b answers to `request`: everything it sends until it closes.
  std::string ask(const std::string& request) {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    TcpStream stream = TcpStream::connect("127.0.0.1", port(), deadline);
    stream.writeAll(request, deadline);
    std::string answer;
    for (std::string some; !(some = stream.readSome(1 << 16, deadline)).empty();) answer += some;
    return answer;
  }

  uint16_t port() const {
    const std::string address = peer_->address();
    return static_cast<uint16_t>(std::stoi(address.substr(address.rfind(':') + 1)));
  }

  fs::path base_;
  std::optional<CheckpointPeerServer> peer_;
};

TEST_F(CheckpointPeers, ACopySentToAPeerIsKeptThereWhole) {
  const fs::path slot = copy(1, 5);
  const CopyReport report = sendRequested(base_ / "a");
  EXPECT_EQ(report.problems, std::vector<std::string>{});
  EXPECT_EQ(report.copied, (std::vector<std::pair<int, int64_t>>{{1, 5}}));
  for (const char* name : kCopyFiles) EXPECT_EQ(read(held(1, 5) / name), read(slot / name));
  EXPECT_FALSE(fs::exists(slot / "replicate"));      // taken: its worker may write the slot again
  EXPECT_EQ(read(slot / "replicated"), "5 sent\n");  // what the worker counts its step on
  EXPECT_TRUE(sendRequested(base_ / "a").copied.empty());
}

TEST_F(CheckpointPeers, ACopyThatDoesNotMatchItsChecksumIsNotKept) {
  copy(1, 5, std::string(40, '0'));
  const CopyReport report = sendRequested(base_ / "a");
  EXPECT_TRUE(report.copied.empty());
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_NE(report.problems[0].find("does not match its checksum"), std::string::npos)
      << report.problems[0];
  EXPECT_FALSE(fs::exists(held(1, 5)));
  EXPECT_TRUE(fs::is_empty(held(1, 5).parent_path()));  // nothing half made left
  EXPECT_EQ(read(base_ / "a" / "rank-1" / "slot-0" / "replicated"), "5 failed\n");
}

TEST_F(CheckpointPeers, ARanksTwoNewestStepsStay) {
  for (int64_t step : {1, 2, 3}) {
    copy(0, step);
    EXPECT_EQ(sendRequested(base_ / "a").copied.size(), 1u);
  }
  EXPECT_FALSE(fs::exists(held(0, 1)));
  EXPECT_TRUE(fs::exists(held(0, 2)));
  EXPECT_TRUE(fs::exists(held(0, 3)));
}

TEST_F(CheckpointPeers, AHeldCopyIsSentToWhoeverAsks) {
  const fs::path slot = copy(1, 5);
  sendRequested(base_ / "a");
  const std::string tensors = read(slot / "tensors"), meta = read(slot / "meta");
  const std::string mark = read(slot / "step");
  EXPECT_EQ(ask(getLine(1, 5)), "HAVE 4 8192 " + mark.substr(2, 40) + "\n" + meta + tensors);
  EXPECT_EQ(ask(getLine(1, 6)), "NO no copy of step 6 of rank 1 here\n");
  // Its own workers' copies too: a rank now on another node loads its step from them.
  fs::create_directories(base_ / "b" / "rank-2");
  fs::copy(slot, base_ / "b" / "rank-2" / "slot-1");
  EXPECT_EQ(ask(getLine(2, 5)), "HAVE 4 8192 " + mark.substr(2, 40) + "\n" + meta + tensors);
}

TEST_F(CheckpointPeers, ABadRequestIsAnsweredInOneLine) {
  EXPECT_EQ(ask("HELLO\n"), "NO not a checkpoint peer's request: 'HELLO'\n");
  EXPECT_EQ(ask(std::string(300, 'x')), "NO a request's line is too long\n");
}

TEST_F(CheckpointPeers, APeerThatCannotBeReachedIsOneProblem) {
  const fs::path slot = copy(1, 5);
  std::ofstream(slot / "replicate") << "5 127.0.0.1:1\n";
  const CopyReport report = sendRequested(base_ / "a");
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_NE(report.problems[0].find("rank 1 to 127.0.0.1:1: cannot connect"), std::string::npos)
      << report.problems[0];
  EXPECT_FALSE(fs::exists(slot / "replicate"));
}

}  // namespace
}  // namespace dlrun::agents
