// Training data: Fashion-MNIST from its IDX files (gzip, as Debian's dataset-fashion-mnist
// ships them), or a synthetic set a small MLP can learn; and the sharding of each epoch across
// ranks, with the semantics of PyTorch's DistributedSampler.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dlrun::trainer {

struct Dataset {
  int rows = 0;      // examples
  int features = 0;  // pixels per example
  int classes = 10;
  std::vector<float> images;    // rows x features, scaled to [0, 1], row-major
  std::vector<uint8_t> labels;  // rows
};

// Where Debian's package dataset-fashion-mnist puts the files: --data-dir's default.
inline constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

struct Split {
  Dataset train;
  Dataset test;
};

// Reads train-{images,labels}-idx{3,1}-ubyte.gz and t10k-... from `dir` (plain files without
// .gz are read too). Throws Error with one line naming the file and the problem: missing,
// truncated, a wrong magic number, or images and labels that disagree.
Split loadFashionMnist(const std::string& dir);

// The directory loadFashionMnist reads for --data-dir `dir`: `dir` itself, or its
// FashionMNIST/raw where torchvision's download put the files. Throws Error with one line saying
// how to get the data where the default (Debian's package) is missing, or `dir` is no directory.
// Never reaches the network.
std::string fashionMnistDir(const std::string& dir);

// One IDX file's payload: dimensions and raw bytes. `expectedDims` is 3 for images, 1 labels.
struct IdxFile {
  std::vector<uint32_t> dims;
  std::vector<uint8_t> bytes;
};
IdxFile readIdx(const std::string& path, int expectedDims);

// A learnable synthetic set: 10 Gaussian clusters in `features` dimensions, the closest two
// 6 sigma apart, values clamped to [0, 1], labels r % 10 (balanced, in order).
Split syntheticData(int trainRows, int testRows, int features, uint64_t seed);

// Which examples a rank sees in an epoch, as DistributedSampler does with shuffle=True and
// drop_last=False: a permutation seeded by (seed, epoch) shared by every rank, padded by
// repeating its start to a multiple of worldSize, then every worldSize-th index from `rank`.
// The generator is seeded with seed + epoch, as PyTorch's is.
std::vector<int> shardForEpoch(int rows, int worldSize, int rank, uint64_t seed, int epoch);

}  // namespace dlrun::trainer
