// Trainer checkpoints: a round trip; a torn or corrupt newer file never wins over a valid older
// one; temporary files are ignored; only the newest few are kept; a directory that cannot be
// written gives one line and leaves nothing behind.
#include "trainer/checkpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "common/error.h"

namespace dlrun::trainer {
namespace {

namespace fs = std::filesystem;

Checkpoint sample(int64_t step, float base = 0.0f) {
  Checkpoint c;
  c.epoch = 2;
  c.samplesInEpoch = 1280;
  c.globalStep = step;
  c.widths = {5, 4, 3};
  for (int i = 0; i < 39; ++i) {
    c.params.push_back(base + 0.25f * static_cast<float>(i));
    c.velocity.push_back(-0.5f * static_cast<float>(i));
  }
  return c;
}

void expectSame(const Checkpoint& a, const Checkpoint& b) {
  EXPECT_EQ(a.epoch, b.epoch);
  EXPECT_EQ(a.samplesInEpoch, b.samplesInEpoch);
  EXPECT_EQ(a.globalStep, b.globalStep);
  EXPECT_EQ(a.widths, b.widths);
  EXPECT_EQ(a.params, b.params);
  EXPECT_EQ(a.velocity, b.velocity);
}

std::string readAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void writeAll(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::vector<std::string> names(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& entry : fs::directory_iterator(dir)) out.push_back(entry.path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

class CheckpointTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "trainer_checkpoint_test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }
  fs::path file(int64_t step) const {
    return dir_ / ("checkpoint-" + std::to_string(step) + ".bin");
  }

  fs::path dir_;
};

TEST_F(CheckpointTest, RoundTrip) {
  const Checkpoint saved = sample(100);
  saveCheckpoint(dir_.string(), saved);
  EXPECT_EQ(names(dir_), std::vector<std::string>{"checkpoint-100.bin"});  // no temporary left
  auto loaded = loadNewestCheckpoint(dir_.string());
  ASSERT_TRUE(loaded.has_value());
  expectSame(*loaded, saved);
}

TEST_F(CheckpointTest, EmptyOrMissingDirectoryHasNone) {
  EXPECT_FALSE(loadNewestCheckpoint(dir_.string()).has_value());
  EXPECT_FALSE(loadNewestCheckpoint((dir_ / "nowhere").string()).has_value());
}

TEST_F(CheckpointTest, NewestValidWins) {
  saveCheckpoint(dir_.string(), sample(100, 1.0f));
  saveCheckpoint(dir_.string(), sample(200, 2.0f));
  auto loaded = loadNewestCheckpoint(dir_.string());
  ASSERT_TRUE(loaded.has_value());
  expectSame(*loaded, sample(200, 2.0f));
}

TEST_F(CheckpointTest, TruncatedNewerCheckpointIsNeverLoaded) {
  const Checkpoint valid = sample(100);
  saveCheckpoint(dir_.string(), valid);
  const std::string whole = readAll(file(100));
  // A newer file torn at every interesting length: empty, inside the magic, inside the header,
  // inside the payload, and missing only the last byte of the CRC.
  for (size_t length : {size_t{0}, size_t{3}, size_t{20}, whole.size() / 2, whole.size() - 1}) {
    SCOPED_TRACE("torn at " + std::to_string(length) + " of " + std::to_string(whole.size()));
    writeAll(file(200), whole.substr(0, length));
    EXPECT_FALSE(readCheckpoint(file(200).string()).has_value());
    auto loaded = loadNewestCheckpoint(dir_.string());
    ASSERT_TRUE(loaded.has_value());
    expectSame(*loaded, valid);
  }
}

TEST_F(CheckpointTest, CorruptedByteFailsTheCrc) {
  const Checkpoint valid = sample(100);
  saveCheckpoint(dir_.string(), valid);
  saveCheckpoint(dir_.string(), sample(200, 5.0f));
  std::string bytes = readAll(file(200));
  ASSERT_GT(bytes.size(), 100u);
  bytes[bytes.size() / 2] ^= 0x10;  // one bit in the middle of the parameters
  writeAll(file(200), bytes);
  EXPECT_FALSE(readCheckpoint(file(200).string()).has_value());
  auto loaded = loadNewestCheckpoint(dir_.string());
  ASSERT_TRUE(loaded.has_value());
  expectSame(*loaded, valid);
}

TEST_F(CheckpointTest, OtherFilesAndStrayTemporariesAreIgnored) {
  const Checkpoint valid = sample(100);
  saveCheckpoint(dir_.string(), valid);
  // A complete, valid newer checkpoint under temporary names (a writer killed before its
  // rename) and under names that are not checkpoints: none of them is loaded.
  const std::string newer = [&] {
    const fs::path other = dir_ / "other";
    fs::create_directory(other);
    saveCheckpoint(other.string(), sample(900, 9.0f));
    std::string bytes = readAll(other / "checkpoint-900.bin");
    fs::remove_all(other);
    return bytes;
  }();
  writeAll(dir_ / (".checkpoint-" + std::to_string(::getpid()) + ".tmp"), newer);
  writeAll(dir_ / "checkpoint-900.bin.tmp", newer);
  writeAll(dir_ / "checkpoint-x.bin", newer);
  writeAll(dir_ / "model-900.bin", newer);
  auto loaded = loadNewestCheckpoint(dir_.string());
  ASSERT_TRUE(loaded.has_value());
  expectSame(*loaded, valid);
}

TEST_F(CheckpointTest, KeepsOnlyTheNewest) {
  for (int64_t step : {100, 200, 300, 400}) saveCheckpoint(dir_.string(), sample(step), 2);
  EXPECT_EQ(names(dir_), (std::vector<std::string>{"checkpoint-300.bin", "checkpoint-400.bin"}));
  // Sorted by step as a number, not as text.
  saveCheckpoint(dir_.string(), sample(1000), 2);
  EXPECT_EQ(names(dir_), (std::vector<std::string>{"checkpoint-1000.bin", "checkpoint-400.bin"}));
}

TEST_F(CheckpointTest, UnwritableDirectoryThrowsOneLineAndLeavesNothing) {
  // A directory path under a regular file can never be created.
  const fs::path regular = dir_ / "a-file";
  writeAll(regular, "not a directory");
  const std::string target = (regular / "checkpoints").string();
  try {
    saveCheckpoint(target, sample(100));
    FAIL() << "saveCheckpoint into " << target << " did not throw";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    EXPECT_NE(message.find(target), std::string::npos) << message;
  }
  EXPECT_EQ(names(dir_), std::vector<std::string>{"a-file"});
  EXPECT_EQ(readAll(regular), "not a directory");
}

TEST_F(CheckpointTest, FilesThatAreNotCheckpointsAreRejected) {
  writeAll(file(1), "");
  writeAll(file(2), "DLRNCKPT");
  writeAll(file(3), std::string(4096, 'x'));
  for (int64_t step : {1, 2, 3}) EXPECT_FALSE(readCheckpoint(file(step).string()).has_value());
  EXPECT_FALSE(loadNewestCheckpoint(dir_.string()).has_value());
  EXPECT_FALSE(readCheckpoint((dir_ / "missing.bin").string()).has_value());
}

TEST_F(CheckpointTest, ASaveRemovesTemporaryFilesOfKilledWriters) {
  const fs::path stale = dir_ / ".checkpoint-99999.tmp";
  writeAll(stale, "half a checkpoint");
  saveCheckpoint(dir_.string(), sample(10));
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(dir_ / "checkpoint-10.bin"));
}

}  // namespace
}  // namespace dlrun::trainer
