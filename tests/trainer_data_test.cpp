// Trainer data: the IDX reader on good and broken files (gzip and plain), Fashion-MNIST from
// Debian's package, the synthetic set, and the per-epoch sharding that makes N workers at batch
// B/N see what one worker at batch B sees.
#include "trainer/data.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <set>

#include "common/error.h"

namespace dlrun::trainer {
namespace {

namespace fs = std::filesystem;

std::string bigEndian(uint32_t v) {
  return {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
          static_cast<char>(v)};
}

// An IDX file: magic, dims, then `payload` (which need not match the dims).
std::string idx(uint32_t magic, const std::vector<uint32_t>& dims, const std::string& payload) {
  std::string out = bigEndian(magic);
  for (uint32_t d : dims) out += bigEndian(d);
  return out + payload;
}

std::string countingBytes(size_t n) {
  std::string out(n, '\0');
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<char>(i * 7 % 256);
  return out;
}

// Runs `f`, which must throw dlrun::Error; returns its message.
std::string errorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-dlrun exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "did not throw";
  return "";
}

#define EXPECT_ONE_LINE_NAMING(message, path)                                            \
  do {                                                                                   \
    EXPECT_EQ((message).find('\n'), std::string::npos) << (message);                     \
    EXPECT_NE((message).find(path), std::string::npos) << (message) << " vs " << (path); \
  } while (0)

class TempDirTest : public testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "trainer_data_test-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes `contents` gzip-compressed (name gets ".gz") or plain; returns the path.
  std::string write(const std::string& name, const std::string& contents, bool gzip) {
    const std::string path = (dir_ / (gzip ? name + ".gz" : name)).string();
    if (gzip) {
      gzFile f = gzopen(path.c_str(), "wb");
      EXPECT_NE(f, nullptr);
      if (!contents.empty()) {
        EXPECT_EQ(gzwrite(f, contents.data(), static_cast<unsigned>(contents.size())),
                  static_cast<int>(contents.size()));
      }
      EXPECT_EQ(gzclose(f), Z_OK);
    } else {
      std::ofstream(path, std::ios::binary) << contents;
    }
    return path;
  }

  // Runs `check(path)` on `contents` written gzipped and plain.
  void forBoth(const std::string& contents, const std::function<void(const std::string&)>& check) {
    for (bool gzip : {true, false}) {
      SCOPED_TRACE(gzip ? "gzip" : "plain");
      check(write("f" + std::to_string(files_++), contents, gzip));
    }
  }

  fs::path dir_;
  int files_ = 0;
};

using ReadIdxTest = TempDirTest;

TEST_F(ReadIdxTest, ReadsLabels) {
  const std::string payload("\x01\x02\x03\x09\x00\x05", 6);
  forBoth(idx(0x801, {6}, payload), [&](const std::string& path) {
    const IdxFile f = readIdx(path, 1);
    EXPECT_EQ(f.dims, std::vector<uint32_t>{6});
    EXPECT_EQ(f.bytes, (std::vector<uint8_t>{1, 2, 3, 9, 0, 5}));
  });
}

TEST_F(ReadIdxTest, ReadsImages) {
  const std::string payload = countingBytes(2 * 3 * 4);
  forBoth(idx(0x803, {2, 3, 4}, payload), [&](const std::string& path) {
    const IdxFile f = readIdx(path, 3);
    EXPECT_EQ(f.dims, (std::vector<uint32_t>{2, 3, 4}));
    EXPECT_EQ(f.bytes, std::vector<uint8_t>(payload.begin(), payload.end()));
  });
}

TEST_F(ReadIdxTest, ReadsALargePayloadInFull) {
  const std::string payload = countingBytes(300 * 28 * 28);
  forBoth(idx(0x803, {300, 28, 28}, payload), [&](const std::string& path) {
    const IdxFile f = readIdx(path, 3);
    EXPECT_EQ(f.bytes, std::vector<uint8_t>(payload.begin(), payload.end()));
  });
}

TEST_F(ReadIdxTest, FallsBackBetweenGzipAndPlainNames) {
  const std::string plain = write("labels", idx(0x801, {1}, "\x07"), false);
  EXPECT_EQ(readIdx(plain + ".gz", 1).bytes, std::vector<uint8_t>{7});
  const std::string gz = write("other", idx(0x801, {1}, "\x04"), true);
  EXPECT_EQ(readIdx(gz.substr(0, gz.size() - 3), 1).bytes, std::vector<uint8_t>{4});
}

TEST_F(ReadIdxTest, MissingFile) {
  const std::string path = (dir_ / "absent-idx1-ubyte.gz").string();
  const std::string message = errorOf([&] { readIdx(path, 1); });
  EXPECT_ONE_LINE_NAMING(message, path);
  EXPECT_NE(message.find("no such file"), std::string::npos) << message;
}

TEST_F(ReadIdxTest, DirectoryIsUnreadable) {
  fs::create_directory(dir_ / "adir");
  const std::string path = (dir_ / "adir").string();
  const std::string message = errorOf([&] { readIdx(path, 1); });
  EXPECT_ONE_LINE_NAMING(message, path);
}

TEST_F(ReadIdxTest, TruncatedHeader) {
  for (const std::string& contents : {std::string(), std::string("\0\0", 2),
                                      idx(0x803, {3, 28}, ""), idx(0x803, {3, 28}, "\0\0")}) {
    forBoth(contents, [&](const std::string& path) {
      const std::string message = errorOf([&] { readIdx(path, 3); });
      EXPECT_ONE_LINE_NAMING(message, path);
      EXPECT_NE(message.find("truncated header"), std::string::npos) << message;
    });
  }
}

TEST_F(ReadIdxTest, TruncatedPayload) {
  forBoth(idx(0x803, {2, 5, 1}, countingBytes(7)), [&](const std::string& path) {
    const std::string message = errorOf([&] { readIdx(path, 3); });
    EXPECT_ONE_LINE_NAMING(message, path);
    EXPECT_NE(message.find("truncated payload"), std::string::npos) << message;
    EXPECT_NE(message.find("10 bytes, found 7"), std::string::npos) << message;
  });
}

TEST_F(ReadIdxTest, WrongMagic) {
  forBoth(idx(0x00000d03, {1, 1, 1}, "x"), [&](const std::string& path) {  // float32 IDX
    const std::string message = errorOf([&] { readIdx(path, 3); });
    EXPECT_ONE_LINE_NAMING(message, path);
    EXPECT_NE(message.find("wrong magic 0x00000d03"), std::string::npos) << message;
    EXPECT_NE(message.find("expected 0x00000803"), std::string::npos) << message;
  });
  forBoth("GIF89a-not-idx", [&](const std::string& path) {
    const std::string message = errorOf([&] { readIdx(path, 1); });
    EXPECT_ONE_LINE_NAMING(message, path);
    EXPECT_NE(message.find("wrong magic 0x47494638"), std::string::npos) << message;
  });
}

TEST_F(ReadIdxTest, WrongNumberOfDimensions) {
  forBoth(idx(0x801, {4}, "abcd"), [&](const std::string& path) {
    const std::string message = errorOf([&] { readIdx(path, 3); });
    EXPECT_ONE_LINE_NAMING(message, path);
    EXPECT_NE(message.find("has 1 dimensions, expected 3"), std::string::npos) << message;
  });
}

// Headers that would ask for far more memory than any real file, with no payload behind them:
// a reader that allocated first would die of bad_alloc or report a truncated payload instead.
TEST_F(ReadIdxTest, AbsurdDimensionsRejectedBeforeAllocating) {
  const std::vector<std::vector<uint32_t>> shapes = {
      {0xffffffffu, 0xffffffffu, 0xffffffffu},
      {0x80000000u, 0x80000000u, 4},  // product wraps to 0 in 64 bits
      {65536, 65536, 65536},
      {1u << 15, 1u << 15, 2},  // 2 GiB: allocatable on a big machine, still over the cap
  };
  for (const auto& dims : shapes) {
    forBoth(idx(0x803, dims, ""), [&](const std::string& path) {
      const std::string message = errorOf([&] { readIdx(path, 3); });
      EXPECT_ONE_LINE_NAMING(message, path);
      EXPECT_NE(message.find("absurd dimensions"), std::string::npos) << message;
    });
  }
  forBoth(idx(0x801, {0xfffffff0u}, ""), [&](const std::string& path) {
    const std::string message = errorOf([&] { readIdx(path, 1); });
    EXPECT_NE(message.find("absurd dimensions 4294967280"), std::string::npos) << message;
  });
}

TEST_F(ReadIdxTest, ExtraTrailingBytes) {
  forBoth(idx(0x801, {3}, "abcd"), [&](const std::string& path) {
    const std::string message = errorOf([&] { readIdx(path, 1); });
    EXPECT_ONE_LINE_NAMING(message, path);
    EXPECT_NE(message.find("longer than its header says"), std::string::npos) << message;
  });
}

TEST_F(ReadIdxTest, DamagedGzipStream) {
  const std::string contents = idx(0x803, {50, 20, 20}, countingBytes(50 * 20 * 20));
  const std::string path = write("damaged", contents, true);
  std::string gz;
  {
    std::ifstream in(path, std::ios::binary);
    gz.assign(std::istreambuf_iterator<char>(in), {});
  }
  ASSERT_GT(gz.size(), 40u);
  // Cut short mid-stream, then a flipped byte in the deflate data, then a bad CRC trailer.
  std::vector<std::string> damaged = {gz.substr(0, gz.size() / 2), gz, gz};
  damaged[1][gz.size() / 2] ^= 0x55;
  damaged[2][gz.size() - 6] ^= 0x01;
  for (const std::string& bytes : damaged) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
    const std::string message = errorOf([&] { readIdx(path, 3); });
    EXPECT_ONE_LINE_NAMING(message, path);
  }
}

// --- Fashion-MNIST ---

TEST(FashionMnist, LoadsDebianFiles) {
  if (!fs::is_directory(kDefaultDataDir)) GTEST_SKIP() << kDefaultDataDir << " is not installed";
  const Split split = loadFashionMnist(kDefaultDataDir);
  const std::array<std::pair<const Dataset*, int>, 2> sets = {std::pair{&split.train, 60000},
                                                              std::pair{&split.test, 10000}};
  for (const auto& [data, rows] : sets) {
    EXPECT_EQ(data->rows, rows);
    EXPECT_EQ(data->features, 784);
    EXPECT_EQ(data->classes, 10);
    ASSERT_EQ(data->images.size(), static_cast<size_t>(rows) * 784);
    ASSERT_EQ(data->labels.size(), static_cast<size_t>(rows));
    std::array<int, 10> perClass{};
    for (uint8_t label : data->labels) {
      ASSERT_LT(label, 10);
      ++perClass[label];
    }
    for (int count : perClass) EXPECT_EQ(count, rows / 10);  // Fashion-MNIST is balanced
    const auto [lo, hi] = std::minmax_element(data->images.begin(), data->images.end());
    EXPECT_EQ(*lo, 0.0f);
    EXPECT_EQ(*hi, 1.0f);
  }
}

class FashionDirTest : public TempDirTest {
 protected:
  // A tiny Fashion-MNIST-shaped directory: train has `trainRows` images of 2x3 pixels.
  void writeSet(int trainImages, int trainLabels, uint32_t testCols = 3, char badLabel = 0) {
    std::string trainLabelBytes = countingBytes(trainLabels);
    for (char& c : trainLabelBytes) c = static_cast<char>(static_cast<uint8_t>(c) % 10);
    if (badLabel) trainLabelBytes[1] = badLabel;
    std::string pixels(static_cast<size_t>(trainImages) * 6, '\0');
    pixels[0] = '\xff';
    pixels[1] = '\x33';
    write("train-images-idx3-ubyte", idx(0x803, {uint32_t(trainImages), 2, 3}, pixels), true);
    write("train-labels-idx1-ubyte", idx(0x801, {uint32_t(trainLabels)}, trainLabelBytes), true);
    write("t10k-images-idx3-ubyte", idx(0x803, {2, 2, testCols}, std::string(4 * testCols, 'a')),
          false);
    write("t10k-labels-idx1-ubyte", idx(0x801, {2}, "\x01\x09"), false);
  }
};

TEST_F(FashionDirTest, LoadsAndScales) {
  writeSet(5, 5);
  const Split split = loadFashionMnist(dir_.string());
  EXPECT_EQ(split.train.rows, 5);
  EXPECT_EQ(split.train.features, 6);
  EXPECT_FLOAT_EQ(split.train.images[0], 1.0f);
  EXPECT_FLOAT_EQ(split.train.images[1], 0.2f);
  EXPECT_FLOAT_EQ(split.train.images[2], 0.0f);
  EXPECT_EQ(split.test.rows, 2);
  EXPECT_EQ(split.test.labels, (std::vector<uint8_t>{1, 9}));
  EXPECT_FLOAT_EQ(split.test.images[0], 97.0f / 255.0f);
}

TEST_F(FashionDirTest, LabelCountMismatch) {
  writeSet(6, 5);
  const std::string message = errorOf([&] { loadFashionMnist(dir_.string()); });
  EXPECT_ONE_LINE_NAMING(message, "train-labels-idx1-ubyte.gz");
  EXPECT_NE(message.find("train-images-idx3-ubyte.gz"), std::string::npos) << message;
  EXPECT_NE(message.find("5 labels"), std::string::npos) << message;
  EXPECT_NE(message.find("6 images"), std::string::npos) << message;
}

TEST_F(FashionDirTest, LabelOutOfRange) {
  writeSet(4, 4, 3, 10);
  const std::string message = errorOf([&] { loadFashionMnist(dir_.string()); });
  EXPECT_ONE_LINE_NAMING(message, "train-labels-idx1-ubyte.gz");
  EXPECT_NE(message.find("label 10 at index 1"), std::string::npos) << message;
}

TEST_F(FashionDirTest, TestImagesOfAnotherShape) {
  writeSet(4, 4, 4);
  const std::string message = errorOf([&] { loadFashionMnist(dir_.string()); });
  EXPECT_ONE_LINE_NAMING(message, "t10k-images-idx3-ubyte");
  EXPECT_NE(message.find("2x4"), std::string::npos) << message;
}

TEST_F(FashionDirTest, MissingFileIsNamed) {
  writeSet(4, 4);
  fs::remove(dir_ / "t10k-labels-idx1-ubyte");
  const std::string message = errorOf([&] { loadFashionMnist(dir_.string()); });
  EXPECT_ONE_LINE_NAMING(message, "t10k-labels-idx1-ubyte");
}

TEST_F(FashionDirTest, DataDirIsTheDirectoryOrTorchvisionsRawBelowIt) {
  writeSet(4, 4);
  EXPECT_EQ(fashionMnistDir(dir_.string()), dir_.string());
  const fs::path root = dir_ / "torchvision";
  fs::create_directories(root / "FashionMNIST" / "raw");
  for (const auto& entry : fs::directory_iterator(dir_)) {
    if (entry.is_regular_file()) fs::copy(entry.path(), root / "FashionMNIST" / "raw");
  }
  EXPECT_EQ(fashionMnistDir(root.string()), (root / "FashionMNIST" / "raw").string());
  EXPECT_EQ(loadFashionMnist(fashionMnistDir(root.string())).train.rows, 4);
}

TEST_F(FashionDirTest, DataDirThatIsNoDirectoryIsOneLine) {
  const std::string missing = (dir_ / "nowhere").string();
  const std::string message = errorOf([&] { fashionMnistDir(missing); });
  EXPECT_ONE_LINE_NAMING(message, "--data-dir " + missing + ": no such directory");
  // An empty directory goes on to the loader, which names the first file it lacks.
  EXPECT_EQ(fashionMnistDir(dir_.string()), dir_.string());
}

// --- Synthetic data ---

TEST(SyntheticData, SameSeedSameDataOtherSeedOtherData) {
  const Split a = syntheticData(500, 100, 20, 7);
  const Split b = syntheticData(500, 100, 20, 7);
  const Split c = syntheticData(500, 100, 20, 8);
  EXPECT_EQ(a.train.images, b.train.images);
  EXPECT_EQ(a.train.labels, b.train.labels);
  EXPECT_EQ(a.test.images, b.test.images);
  EXPECT_NE(a.train.images, c.train.images);
  EXPECT_NE(a.test.images, c.test.images);
  // The test set continues the generator rather than repeating the training set's draws.
  EXPECT_FALSE(std::equal(a.test.images.begin(), a.test.images.end(), a.train.images.begin()));
}

TEST(SyntheticData, ShapesBalancedLabelsAndRange) {
  const Split split = syntheticData(1003, 250, 32, 1);
  for (const Dataset* data : {&split.train, &split.test}) {
    ASSERT_EQ(data->images.size(), static_cast<size_t>(data->rows) * 32);
    ASSERT_EQ(data->labels.size(), static_cast<size_t>(data->rows));
    EXPECT_EQ(data->features, 32);
    EXPECT_EQ(data->classes, 10);
    std::array<int, 10> perClass{};
    for (uint8_t label : data->labels) {
      ASSERT_LT(label, 10);
      ++perClass[label];
    }
    const auto [lo, hi] = std::minmax_element(perClass.begin(), perClass.end());
    EXPECT_LE(*hi - *lo, 1);
    for (float v : data->images) ASSERT_TRUE(v >= 0.0f && v <= 1.0f) << v;
  }
  EXPECT_EQ(split.train.rows, 1003);
  EXPECT_EQ(split.test.rows, 250);
}

// Nearest class mean, fitted on train, stands in for the MLP: learnable means well above 90%,
// not trivial means some test examples are misclassified.
double nearestMeanAccuracy(const Split& split) {
  const int f = split.train.features;
  std::vector<double> means(10 * f, 0.0);
  std::array<int, 10> counts{};
  for (int r = 0; r < split.train.rows; ++r) {
    const int label = split.train.labels[r];
    ++counts[label];
    for (int i = 0; i < f; ++i) means[label * f + i] += split.train.images[size_t(r) * f + i];
  }
  for (int c = 0; c < 10; ++c)
    for (int i = 0; i < f; ++i) means[c * f + i] /= counts[c];
  int correct = 0;
  for (int r = 0; r < split.test.rows; ++r) {
    int best = 0;
    double bestDistance = 1e300;
    for (int c = 0; c < 10; ++c) {
      double d = 0;
      for (int i = 0; i < f; ++i) {
        const double diff = split.test.images[size_t(r) * f + i] - means[c * f + i];
        d += diff * diff;
      }
      if (d < bestDistance) bestDistance = d, best = c;
    }
    correct += best == split.test.labels[r];
  }
  return double(correct) / split.test.rows;
}

TEST(SyntheticData, LearnableButNotTrivial) {
  for (int features : {64, 784}) {
    for (uint64_t seed : {1, 2, 3}) {
      SCOPED_TRACE("features " + std::to_string(features) + " seed " + std::to_string(seed));
      const double accuracy = nearestMeanAccuracy(syntheticData(4000, 4000, features, seed));
      EXPECT_GT(accuracy, 0.93);
      EXPECT_LT(accuracy, 0.9995);
    }
  }
}

TEST(SyntheticData, RejectsBadArguments) {
  EXPECT_THROW(syntheticData(0, 10, 10, 1), Error);
  EXPECT_THROW(syntheticData(10, -1, 10, 1), Error);
  EXPECT_THROW(syntheticData(10, 10, 0, 1), Error);
  EXPECT_THROW(syntheticData(1 << 20, 0, 1 << 10, 1), Error);
}

// --- Sharding ---

TEST(ShardForEpoch, ShardsCoverEveryIndexAndOverlapOnlyInPadding) {
  for (int rows : {1, 3, 7, 1000, 1003}) {
    for (int world : {1, 2, 4, 8}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + " world " + std::to_string(world));
      const int perRank = (rows + world - 1) / world;
      std::vector<std::vector<int>> shards;
      for (int rank = 0; rank < world; ++rank) {
        shards.push_back(shardForEpoch(rows, world, rank, 42, 3));
        ASSERT_EQ(shards.back().size(), static_cast<size_t>(perRank));
      }
      // Interleave back into DistributedSampler's padded list: position i is shard i%W, i/W.
      std::vector<int> padded;
      for (int i = 0; i < perRank * world; ++i) padded.push_back(shards[i % world][i / world]);
      std::vector<int> head(padded.begin(), padded.begin() + rows);
      std::sort(head.begin(), head.end());
      std::vector<int> all(rows);
      std::iota(all.begin(), all.end(), 0);
      EXPECT_EQ(head, all);  // the first `rows` positions are a permutation: no overlap
      for (size_t i = rows; i < padded.size(); ++i) EXPECT_EQ(padded[i], padded[i % rows]) << i;
    }
  }
}

TEST(ShardForEpoch, SameSeedAndEpochSameShardOtherwiseDifferent) {
  const std::vector<int> a = shardForEpoch(1000, 4, 1, 5, 2);
  EXPECT_EQ(a, shardForEpoch(1000, 4, 1, 5, 2));
  EXPECT_NE(a, shardForEpoch(1000, 4, 1, 5, 3));
  EXPECT_NE(a, shardForEpoch(1000, 4, 1, 6, 2));
  std::vector<int> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(shardForEpoch(1000, 1, 0, 5, 2), identity);
}

// Pins the permutation so that a change of generator or shuffle (std::shuffle is
// implementation-defined) shows up here rather than as workers that disagree across platforms.
TEST(ShardForEpoch, PermutationIsPinned) {
  EXPECT_EQ(shardForEpoch(10, 1, 0, 42, 0), (std::vector<int>{1, 7, 9, 0, 3, 8, 4, 2, 5, 6}));
}

// What makes 4 workers at batch 16 equal 1 worker at batch 64: in every step k, the union of the
// ranks' k-th batches is the single worker's k-th batch.
TEST(ShardForEpoch, RankBatchesUnionToTheSingleWorkerBatch) {
  constexpr int kRows = 1000, kWorld = 4, kBatch = 16;
  const std::vector<int> single = shardForEpoch(kRows, 1, 0, 9, 4);
  std::vector<std::vector<int>> shards;
  for (int rank = 0; rank < kWorld; ++rank)
    shards.push_back(shardForEpoch(kRows, kWorld, rank, 9, 4));
  for (int k = 0; k < 10; ++k) {
    std::multiset<int> ranksBatch;
    for (const auto& shard : shards)
      ranksBatch.insert(shard.begin() + k * kBatch, shard.begin() + (k + 1) * kBatch);
    const std::multiset<int> singleBatch(single.begin() + k * kBatch * kWorld,
                                         single.begin() + (k + 1) * kBatch * kWorld);
    EXPECT_EQ(ranksBatch, singleBatch) << "step " << k;
    EXPECT_EQ(std::set<int>(ranksBatch.begin(), ranksBatch.end()).size(), size_t(kBatch * kWorld));
  }
}

TEST(ShardForEpoch, RejectsBadArguments) {
  for (const auto& [rows, world, rank] : std::vector<std::array<int, 3>>{
           {0, 1, 0}, {-5, 1, 0}, {10, 0, 0}, {10, -1, 0}, {10, 4, 4}, {10, 4, -1}}) {
    const std::string message = errorOf([&] { shardForEpoch(rows, world, rank, 1, 0); });
    EXPECT_EQ(message.find('\n'), std::string::npos);
    EXPECT_NE(message.find("shardForEpoch"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace dlrun::trainer
