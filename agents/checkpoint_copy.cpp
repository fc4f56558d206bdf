#include "agents/checkpoint_copy.h"

#include <algorithm>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace dlrun::agents {

namespace {

constexpr uint64_t kBlock = 4096;  // CopyChecksum's block (checkpoint_wire.h)

uint64_t roundUp8(uint64_t n) { return (n + 7) / 8 * 8; }

#if defined(__SSE2__)
uint64_t lanes(__m128i sum) {
  uint64_t both[2];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(both), sum);
  return both[0] + both[1];
}
#endif

// Copies `n` bytes to `to` (8-byte aligned) and returns the sum of the words written; a last
// partial word is completed with zeros (the caller leaves room for it).
uint64_t copyWords(char* to, const char* from, uint64_t n) {
  uint64_t sum = 0, done = 0;
  auto word = [&](uint64_t bytes) {
    uint64_t value = 0;
    std::memcpy(&value, from + done, bytes);
    std::memcpy(to + done, &value, sizeof value);
    sum += value;
    done += bytes;
  };
#if defined(__SSE2__)
  // Streaming stores write 16-byte aligned lanes.
  if (reinterpret_cast<uintptr_t>(to) % 16 != 0 && n >= 8) word(8);
  __m128i a = _mm_setzero_si128(), b = a, c = a, d = a;
  for (; done + 64 <= n; done += 64) {
    const auto* in = reinterpret_cast<const __m128i*>(from + done);
    auto* out = reinterpret_cast<__m128i*>(to + done);
    const __m128i w = _mm_loadu_si128(in), x = _mm_loadu_si128(in + 1), y = _mm_loadu_si128(in + 2),
                  z = _mm_loadu_si128(in + 3);
    a = _mm_add_epi64(a, w);
    b = _mm_add_epi64(b, x);
    c = _mm_add_epi64(c, y);
    d = _mm_add_epi64(d, z);
    _mm_stream_si128(out, w);
    _mm_stream_si128(out + 1, x);
    _mm_stream_si128(out + 2, y);
    _mm_stream_si128(out + 3, z);
  }
  sum += lanes(_mm_add_epi64(_mm_add_epi64(a, b), _mm_add_epi64(c, d)));
#endif
  while (done + 8 <= n) word(8);
  if (done < n) word(n - done);
  return sum;
}

bool fits(uint64_t size, const CopyPiece* pieces, size_t count) {
  if (size % kBlock != 0) return false;
  uint64_t end = 0;  // of the previous piece, its last word whole
  for (size_t i = 0; i < count; ++i) {
    const CopyPiece& piece = pieces[i];
    if (piece.offset % 8 != 0 || piece.offset < end || piece.offset > size || piece.bytes > size ||
        roundUp8(piece.bytes) > size - piece.offset)
      return false;
    end = piece.offset + roundUp8(piece.bytes);
  }
  return true;
}

}  // namespace

bool copyAndSumBlocks(char* copy, uint64_t size, const CopyPiece* pieces, size_t count,
                      uint64_t* blockSums) {
  if (reinterpret_cast<uintptr_t>(copy) % 16 != 0 || !fits(size, pieces, count)) return false;
  std::fill(blockSums, blockSums + size / kBlock, 0);
  uint64_t at = 0;  // the copy is written up to here
  for (size_t i = 0; i < count; ++i) {
    const CopyPiece& piece = pieces[i];
    std::memset(copy + at, 0, piece.offset - at);
    for (uint64_t done = 0; done < piece.bytes;) {  // block by block: each has its sum
      const uint64_t offset = piece.offset + done;
      const uint64_t n = std::min(piece.bytes - done, kBlock - offset % kBlock);
      blockSums[offset / kBlock] += copyWords(copy + offset, piece.from + done, n);
      done += n;
    }
    at = piece.offset + roundUp8(piece.bytes);
  }
  std::memset(copy + at, 0, size - at);
#if defined(__SSE2__)
  _mm_sfence();  // the streamed lines reach memory before the copy is marked whole
#endif
  return true;
}

void sumBlocks(const char* data, uint64_t size, uint64_t* blockSums) {
  for (uint64_t block = 0; block < size / kBlock; ++block) {
    const char* at = data + block * kBlock;
    uint64_t sum = 0, done = 0;
#if defined(__SSE2__)
    __m128i a = _mm_setzero_si128(), b = a, c = a, d = a;
    for (; done < kBlock; done += 64) {
      const auto* in = reinterpret_cast<const __m128i*>(at + done);
      a = _mm_add_epi64(a, _mm_loadu_si128(in));
      b = _mm_add_epi64(b, _mm_loadu_si128(in + 1));
      c = _mm_add_epi64(c, _mm_loadu_si128(in + 2));
      d = _mm_add_epi64(d, _mm_loadu_si128(in + 3));
    }
    sum = lanes(_mm_add_epi64(_mm_add_epi64(a, b), _mm_add_epi64(c, d)));
#endif
    for (; done < kBlock; done += 8) {
      uint64_t value;
      std::memcpy(&value, at + done, sizeof value);
      sum += value;
    }
    blockSums[block] = sum;
  }
}

}  // namespace dlrun::agents
