#include "trainer/data.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numbers>
#include <numeric>
#include <random>

#include "common/error.h"

namespace dlrun::trainer {
namespace {

namespace fs = std::filesystem;

constexpr uint64_t kMaxPayload = uint64_t{1} << 30;  // Fashion-MNIST's largest file is 47 MB

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw Error(path + ": " + problem);
}

// Debian ships the files gzipped; someone who gunzipped them by hand should not have to care.
std::string resolvePath(const std::string& path) {
  std::error_code ec;
  if (fs::exists(path, ec)) return path;
  const std::string alt = path.ends_with(".gz") ? path.substr(0, path.size() - 3) : path + ".gz";
  if (fs::exists(alt, ec)) return alt;
  fail(path, "no such file (nor " + alt + ")");
}

class GzFile {
 public:
  explicit GzFile(const std::string& path) : path_(path), file_(gzopen(path.c_str(), "rb")) {
    if (!file_) fail(path_, std::string("cannot open: ") + std::strerror(errno));
  }
  ~GzFile() { gzclose(file_); }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;

  // Reads up to `size` bytes; fewer only at the end of the data.
  size_t read(uint8_t* out, size_t size) {
    size_t done = 0;
    while (done < size) {
      const unsigned chunk = static_cast<unsigned>(std::min<size_t>(size - done, 1u << 28));
      const int n = gzread(file_, out + done, chunk);
      if (n < 0) {
        std::string why = gzerror(file_, nullptr);
        if (why.starts_with(path_ + ": ")) why.erase(0, path_.size() + 2);  // zlib adds the path
        fail(path_, "unreadable (" + why + ")");
      }
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    return done;
  }

 private:
  std::string path_;
  gzFile file_;
};

uint32_t bigEndian32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | uint32_t{p[3]};
}

std::string hex32(uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", value);
  return text;
}

Dataset toDataset(const IdxFile& images, const IdxFile& labels, const std::string& imagesPath,
                  const std::string& labelsPath) {
  const uint32_t rows = images.dims[0];
  const uint64_t features = uint64_t{images.dims[1]} * images.dims[2];
  if (rows == 0 || features == 0) fail(imagesPath, "holds no pixels");
  if (labels.dims[0] != rows) {
    fail(labelsPath, "has " + std::to_string(labels.dims[0]) + " labels but " + imagesPath +
                         " has " + std::to_string(rows) + " images");
  }
  const auto bad = std::find_if(labels.bytes.begin(), labels.bytes.end(),
                                [](uint8_t label) { return label >= 10; });
  if (bad != labels.bytes.end()) {
    fail(labelsPath, "label " + std::to_string(*bad) + " at index " +
                         std::to_string(bad - labels.bytes.begin()) + " is not below 10");
  }
  // Both fit in an int: rows * features <= kMaxPayload.
  Dataset data{static_cast<int>(rows), static_cast<int>(features), 10,
               std::vector<float>(images.bytes.size()), labels.bytes};
  std::transform(images.bytes.begin(), images.bytes.end(), data.images.begin(),
                 [](uint8_t pixel) { return static_cast<float>(pixel) / 255.0f; });
  return data;
}

// Our own uniform and normal draws on top of mt19937_64 (whose output the standard fixes): the
// standard library's distributions may differ between implementations, and the data must not.
double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1p-53; }

uint64_t uniformBelow(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;  // rejecting below it removes modulo bias
  for (;;) {
    const uint64_t x = rng();
    if (x >= threshold) return x % bound;
  }
}

// Box-Muller, one value per call: simpler than caching the pair's second value, fast enough.
double gaussian(std::mt19937_64& rng) {
  const double radius = std::sqrt(-2.0 * std::log(1.0 - uniform01(rng)));  // never log(0)
  return radius * std::cos(2.0 * std::numbers::pi * uniform01(rng));
}

}  // namespace

IdxFile readIdx(const std::string& requestedPath, int expectedDims) {
  if (expectedDims < 1 || expectedDims > 255) {
    throw Error("readIdx: expectedDims " + std::to_string(expectedDims) + " is not in 1..255");
  }
  const std::string path = resolvePath(requestedPath);
  GzFile file(path);
  const uint32_t expectedMagic = 0x0800u | static_cast<uint32_t>(expectedDims);

  uint8_t magic[4];
  if (const size_t n = file.read(magic, 4); n < 4) {
    fail(path, "truncated header: expected 4 bytes, found " + std::to_string(n));
  }
  if (magic[0] != 0 || magic[1] != 0 || magic[2] != 0x08) {
    fail(path, "wrong magic " + hex32(bigEndian32(magic)) + ", expected " + hex32(expectedMagic) +
                   " (IDX of uint8 with " + std::to_string(expectedDims) + " dimensions)");
  }
  if (magic[3] != expectedDims) {
    fail(path, "has " + std::to_string(magic[3]) + " dimensions, expected " +
                   std::to_string(expectedDims) + " (magic " + hex32(bigEndian32(magic)) + ")");
  }

  std::vector<uint8_t> header(4 * static_cast<size_t>(expectedDims));
  if (const size_t n = file.read(header.data(), header.size()); n < header.size()) {
    fail(path, "truncated header: expected " + std::to_string(4 + header.size()) +
                   " bytes, found " + std::to_string(4 + n));
  }
  IdxFile idx;
  std::string shape;
  for (int i = 0; i < expectedDims; ++i) {
    idx.dims.push_back(bigEndian32(&header[4 * i]));
    if (i) shape += 'x';
    shape += std::to_string(idx.dims.back());
  }
  uint64_t size = 1;
  for (const uint32_t dim : idx.dims) {
    size *= dim;  // cannot overflow: size <= kMaxPayload (2^30) before, dim < 2^32
    if (size > kMaxPayload) {
      fail(path, "absurd dimensions " + shape + ": more than the " +
                     std::to_string(kMaxPayload >> 30) + " GiB limit");
    }
  }

  idx.bytes.resize(size);
  if (const size_t n = file.read(idx.bytes.data(), size); n < size) {
    fail(path, "truncated payload: dimensions " + shape + " need " + std::to_string(size) +
                   " bytes, found " + std::to_string(n));
  }
  // Reading past the end also makes zlib check the gzip trailer's CRC.
  if (uint8_t extra; file.read(&extra, 1) != 0) {
    fail(path, "longer than its header says (dimensions " + shape + ", " + std::to_string(size) +
                   " payload bytes)");
  }
  return idx;
}

Split loadFashionMnist(const std::string& dir) {
  auto pathOf = [&](const char* name) { return (fs::path(dir) / name).string(); };
  const std::string imagesPaths[] = {pathOf("train-images-idx3-ubyte.gz"),
                                     pathOf("t10k-images-idx3-ubyte.gz")};
  const std::string labelsPaths[] = {pathOf("train-labels-idx1-ubyte.gz"),
                                     pathOf("t10k-labels-idx1-ubyte.gz")};
  Dataset sets[2];
  std::vector<uint32_t> trainShape;
  for (int i = 0; i < 2; ++i) {
    const IdxFile images = readIdx(imagesPaths[i], 3);
    const std::vector<uint32_t> shape(images.dims.begin() + 1, images.dims.end());
    if (i == 1 && shape != trainShape) {
      fail(imagesPaths[i], "holds images of " + std::to_string(shape[0]) + "x" +
                               std::to_string(shape[1]) + " pixels, the training set " +
                               std::to_string(trainShape[0]) + "x" + std::to_string(trainShape[1]));
    }
    trainShape = shape;
    sets[i] = toDataset(images, readIdx(labelsPaths[i], 1), imagesPaths[i], labelsPaths[i]);
  }
  return {std::move(sets[0]), std::move(sets[1])};
}

std::string fashionMnistDir(const std::string& dir) {
  const auto holds = [](const fs::path& d) {
    std::error_code ec;
    return fs::exists(d / "train-images-idx3-ubyte.gz", ec) ||
           fs::exists(d / "train-images-idx3-ubyte", ec);
  };
  if (holds(dir)) return dir;
  if (const fs::path raw = fs::path(dir) / "FashionMNIST" / "raw"; holds(raw)) return raw.string();
  std::error_code ec;
  if (dir == kDefaultDataDir && !fs::exists(dir, ec)) {
    throw Error(std::string("no Fashion-MNIST in ") + kDefaultDataDir +
                ": install Debian's package dataset-fashion-mnist there, or put the dataset's four "
                ".gz files (github.com/zalandoresearch/fashion-mnist) in a directory and pass "
                "--data-dir DIR; --synthetic trains on generated data");
  }
  if (!fs::is_directory(dir, ec)) throw Error("--data-dir " + dir + ": no such directory");
  return dir;  // loadFashionMnist names the file that is missing
}

Split syntheticData(int trainRows, int testRows, int features, uint64_t seed) {
  constexpr int kClasses = 10;
  constexpr double kSigma = 0.3;       // large enough that the signal is not lost in the 0.5 offset
  constexpr double kSeparation = 6.0;  // closest centers, in sigmas: about 99% for nearest mean
  if (trainRows < 1 || testRows < 0 || features < 1) {
    throw Error("syntheticData: need trainRows >= 1, testRows >= 0 and features >= 1, got " +
                std::to_string(trainRows) + ", " + std::to_string(testRows) + ", " +
                std::to_string(features));
  }
  if ((int64_t{trainRows} + testRows) * features > int64_t{1} << 28) {
    throw Error("syntheticData: " + std::to_string(int64_t{trainRows} + testRows) + " rows of " +
                std::to_string(features) + " features exceed 2^28 values");
  }
  const size_t n = static_cast<size_t>(features);
  std::mt19937_64 rng(seed);
  std::vector<double> centers(kClasses * n);
  for (double& c : centers) c = uniform01(rng);

  // Centers uniform in the cube sit about sqrt(features / 6) apart: trivial to tell apart in
  // high dimensions, or, with noise to match, mostly clamped. So shrink them towards the middle
  // until the closest two are kSeparation sigmas apart (lowering sigma in low dimensions instead).
  double closest = std::numeric_limits<double>::infinity();
  for (int a = 0; a < kClasses; ++a) {
    for (int b = a + 1; b < kClasses; ++b) {
      double sum = 0;
      for (size_t f = 0; f < n; ++f) {
        const double d = centers[a * n + f] - centers[b * n + f];
        sum += d * d;
      }
      closest = std::min(closest, std::sqrt(sum));
    }
  }
  const double sigma = std::min(kSigma, closest / kSeparation);
  if (closest > 0) {
    for (double& c : centers) c = 0.5 + kSeparation * sigma / closest * (c - 0.5);
  }

  auto draw = [&](int rows) {
    Dataset data{rows, features, kClasses, std::vector<float>(rows * n),
                 std::vector<uint8_t>(rows)};
    for (int r = 0; r < rows; ++r) {
      data.labels[r] = static_cast<uint8_t>(r % kClasses);
      const double* center = &centers[data.labels[r] * n];
      for (size_t f = 0; f < n; ++f) {
        const double value = center[f] + sigma * gaussian(rng);
        data.images[r * n + f] = static_cast<float>(std::clamp(value, 0.0, 1.0));
      }
    }
    return data;
  };
  return {draw(trainRows), draw(testRows)};  // braced: evaluated in order, so deterministic
}

std::vector<int> shardForEpoch(int rows, int worldSize, int rank, uint64_t seed, int epoch) {
  if (rows < 1 || worldSize < 1 || rank < 0 || rank >= worldSize) {
    throw Error("shardForEpoch: need rows >= 1, worldSize >= 1 and 0 <= rank < worldSize, got " +
                std::to_string(rows) + ", " + std::to_string(worldSize) + ", " +
                std::to_string(rank));
  }
  std::vector<int> permutation(rows);
  std::iota(permutation.begin(), permutation.end(), 0);
  std::mt19937_64 rng(seed + static_cast<uint64_t>(static_cast<int64_t>(epoch)));
  for (int i = rows - 1; i > 0; --i) {
    std::swap(permutation[i], permutation[uniformBelow(rng, static_cast<uint64_t>(i) + 1)]);
  }
  // DistributedSampler pads to a multiple of worldSize by appending the permutation's start,
  // cycling when the padding is longer than the permutation: position i holds entry i % rows.
  const int64_t perRank = (int64_t{rows} + worldSize - 1) / worldSize;
  std::vector<int> shard(perRank);
  for (int64_t k = 0; k < perRank; ++k) shard[k] = permutation[(rank + k * worldSize) % rows];
  return shard;
}

}  // namespace dlrun::trainer
