// A save's copy made and summed in one pass (agents/checkpoint_copy.h): the copy holds each
// piece's bytes and zeros everywhere else (a slot rewritten in place loses its old bytes), each
// block's sum is CopyChecksum's, and a layout that does not fit is refused with nothing written.
#include "agents/checkpoint_copy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "agents/checkpoint_wire.h"

namespace dlrun::agents {
namespace {

constexpr size_t kBlock = 4096;

std::vector<char> pattern(size_t bytes, int seed) {
  std::vector<char> data(bytes);
  for (size_t i = 0; i < bytes; ++i) data[i] = static_cast<char>((i * 131 + seed * 17 + 5) % 251);
  return data;
}

// Block sums the slow way, word by word.
std::vector<uint64_t> wordSums(const char* data, size_t size) {
  std::vector<uint64_t> sums(size / kBlock);
  for (size_t at = 0; at < size; at += 8) {
    uint64_t word;
    std::memcpy(&word, data + at, 8);
    sums[at / kBlock] += word;
  }
  return sums;
}

struct Copy {
  explicit Copy(size_t size) : storage(size + 16, '\x5a') {}
  char* data() {  // 16-byte aligned, as a mapping is
    return storage.data() + (16 - reinterpret_cast<uintptr_t>(storage.data()) % 16) % 16;
  }
  std::vector<char> storage;
};

TEST(CheckpointCopy, HoldsEachPieceAndZerosElsewhereWithEachBlocksSum) {
  const size_t size = 4 * kBlock;
  // A piece across a block's end, one from an odd address with a partial last word, one small.
  const std::vector<char> a = pattern(5000, 1), b = pattern(3001 + 1, 2), c = pattern(24, 3);
  const std::vector<CopyPiece> pieces{{.from = a.data(), .offset = 64, .bytes = a.size()},
                                      {.from = b.data() + 1, .offset = 5120, .bytes = 3001},
                                      {.from = c.data(), .offset = 12288, .bytes = c.size()}};
  Copy copy(size);  // its old bytes all 0x5a: they must not stay
  std::vector<uint64_t> sums(size / kBlock, 7);
  ASSERT_TRUE(copyAndSumBlocks(copy.data(), size, pieces.data(), pieces.size(), sums.data()));

  std::vector<char> expected(size, '\0');
  std::memcpy(expected.data() + 64, a.data(), a.size());
  std::memcpy(expected.data() + 5120, b.data() + 1, 3001);
  std::memcpy(expected.data() + 12288, c.data(), c.size());
  EXPECT_EQ(std::vector<char>(copy.data(), copy.data() + size), expected);
  EXPECT_EQ(sums, wordSums(expected.data(), size));

  std::vector<uint64_t> again(size / kBlock);
  sumBlocks(expected.data() + 0, size, again.data());
  EXPECT_EQ(again, sums);
}

TEST(CheckpointCopy, TheSumsMakeTheChecksumOfTheCopy) {
  const size_t size = 64 * kBlock;
  const std::vector<char> state = pattern(size - 100, 4);
  const CopyPiece piece{.from = state.data(), .offset = 0, .bytes = state.size()};
  Copy copy(size);
  std::vector<uint64_t> sums(size / kBlock);
  ASSERT_TRUE(copyAndSumBlocks(copy.data(), size, &piece, 1, sums.data()));
  CopyChecksum whole;
  whole.addTensors(copy.data(), size);
  uint64_t sum = 0, weighted = 0;
  for (size_t i = 0; i < sums.size(); ++i) {
    sum += sums[i];
    weighted += sums[i] * (i + 1);
  }
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(sum),
                static_cast<unsigned long long>(weighted));
  EXPECT_EQ(whole.text().substr(0, 32), text);
}

TEST(CheckpointCopy, RefusesALayoutThatDoesNotFitAndWritesNothing) {
  const std::vector<char> state = pattern(4096, 5);
  const auto refused = [&](std::vector<CopyPiece> pieces, size_t size, size_t shift = 0) {
    Copy copy(2 * kBlock);
    const std::vector<char> before = copy.storage;
    std::vector<uint64_t> sums(2);
    const bool done =
        copyAndSumBlocks(copy.data() + shift, size, pieces.data(), pieces.size(), sums.data());
    return !done && copy.storage == before;
  };
  const CopyPiece ok{.from = state.data(), .offset = 0, .bytes = 100};
  EXPECT_TRUE(refused({{.from = state.data(), .offset = 4, .bytes = 8}}, 2 * kBlock));
  EXPECT_TRUE(refused({{.from = state.data(), .offset = 64, .bytes = 100}, ok}, 2 * kBlock));
  EXPECT_TRUE(refused({{.from = state.data(), .offset = 0, .bytes = 105}, {ok.from, 104, 8}},
                      2 * kBlock));  // the first's last word overlaps the second
  EXPECT_TRUE(refused({{.from = state.data(), .offset = 8192, .bytes = 8}}, 2 * kBlock));
  EXPECT_TRUE(refused({{.from = state.data(), .offset = 8184, .bytes = 9}}, 2 * kBlock));
  EXPECT_TRUE(refused({{.from = state.data(), .offset = 16384, .bytes = 0}}, 2 * kBlock));
  EXPECT_TRUE(refused({ok}, kBlock + 8));   // not whole blocks
  EXPECT_TRUE(refused({ok}, kBlock, 8));    // the copy not 16-byte aligned
  EXPECT_FALSE(refused({ok}, 2 * kBlock));  // and the same pieces fit as they should
}

}  // namespace
}  // namespace dlrun::agents
