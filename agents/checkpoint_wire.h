// What one agent says to another about dlrun.checkpoint's copies (checkpoint_peer.h), pure: one
// request a connection, a line of text, then the copy's bytes.
//   PUT RANK STEP META_BYTES TENSOR_BYTES CHECKSUM\n META TENSORS  ->  "OK\n" | "NO WHY\n"
//   GET RANK STEP\n  ->  "HAVE META_BYTES TENSOR_BYTES CHECKSUM\n" META TENSORS | "NO WHY\n"
// CHECKSUM is the copy's own, as its mark says (CopyChecksum): the receiver of a PUT computes it
// over the bytes it got and keeps the copy only when they match; a worker that GETs a copy checks
// it the same way before it loads it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dlrun::agents {

inline constexpr size_t kPeerLineMax = 256;  // a request's or an answer's line, its '\n' in
inline constexpr uint64_t kPeerMetaMax = 64ull << 20;  // a copy's structure, pickled
inline constexpr size_t kChecksumBlock = 4096;  // a copy's tensors are a whole number of them

struct CopyHeader {
  uint64_t metaBytes = 0;
  uint64_t tensorBytes = 0;
  std::string checksum;
  bool operator==(const CopyHeader&) const = default;
};

struct PeerRequest {
  bool put = false;  // else GET
  int rank = 0;
  int64_t step = 0;
  CopyHeader copy;  // a PUT's
  bool operator==(const PeerRequest&) const = default;
};

std::string putLine(int rank, int64_t step, const CopyHeader& copy);
std::string getLine(int rank, int64_t step);
std::string haveLine(const CopyHeader& copy);
std::string noLine(std::string_view why);  // one line: a newline in `why` becomes a space

// A request's line without its '\n'; throws ProtocolError naming what is wrong.
PeerRequest parseRequest(std::string_view line);
// An answer's line without its '\n': "OK" (nothing returned) or "HAVE ..." (the copy); throws
// Error with the peer's reason for "NO WHY", ProtocolError for anything else.
std::optional<CopyHeader> parseAnswer(std::string_view line);

// python/dlrun/checkpoint.py's _checksum, over bytes as they stream in: the tensors' bytes as
// 64-bit words, summed in 4 KiB blocks (every sum wraps), the sum of the blocks' sums and of those
// weighted by their place (from 1), then CRC-32 of the structure: "%016x%016x%08x".
class CopyChecksum {
 public:
  void addTensors(const char* data, size_t bytes);  // whole blocks, in order
  void setMeta(std::string_view meta);              // the whole structure
  std::string text() const;

 private:
  uint64_t sum_ = 0, weighted_ = 0, blocks_ = 0;
  uint32_t crc_ = 0;
};

}  // namespace dlrun::agents
