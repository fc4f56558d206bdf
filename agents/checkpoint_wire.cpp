#include "agents/checkpoint_wire.h"

#include <algorithm>
#include <boost/crc.hpp>
#include <cstdio>
#include <cstring>
#include <vector>

#include "agents/checkpoint_copy.h"
#include "common/error.h"
#include "common/text.h"

namespace dlrun::agents {

namespace {

bool isChecksum(std::string_view text) {
  return text.size() == 40 && text.find_first_not_of("0123456789abcdef") == std::string::npos;
}

template <typename T>
T number(const std::vector<std::string>& fields, size_t i, T least, const char* what) {
  const auto value = parseInteger<T>(fields.at(i));
  if (!value || *value < least)
    throw ProtocolError(std::string("a checkpoint peer's line has a bad ") + what + ": '" +
                        fields.at(i) + "'");
  return *value;
}

CopyHeader copyFields(const std::vector<std::string>& fields, size_t first) {
  CopyHeader copy{.metaBytes = number<uint64_t>(fields, first, 0, "structure size"),
                  .tensorBytes = number<uint64_t>(fields, first + 1, kChecksumBlock, "size"),
                  .checksum = fields.at(first + 2)};
  if (copy.metaBytes > kPeerMetaMax)
    throw ProtocolError("a checkpoint copy's structure of " + std::to_string(copy.metaBytes) +
                        " bytes is over the limit of " + std::to_string(kPeerMetaMax));
  if (copy.tensorBytes > (1ull << 50))
    throw ProtocolError("a checkpoint copy of " + std::to_string(copy.tensorBytes) +
                        " bytes is over any memory");
  if (copy.tensorBytes % kChecksumBlock != 0)
    throw ProtocolError("a checkpoint copy of " + std::to_string(copy.tensorBytes) +
                        " bytes is not a whole number of 4 KiB blocks");
  if (!isChecksum(copy.checksum))
    throw ProtocolError("a checkpoint copy's checksum is not 40 hex digits: '" +
                        copy.checksum.substr(0, 64) + "'");
  return copy;
}

std::string copyText(const CopyHeader& copy) {
  return std::to_string(copy.metaBytes) + " " + std::to_string(copy.tensorBytes) + " " +
         copy.checksum;
}

}  // namespace

std::string putLine(int rank, int64_t step, const CopyHeader& copy) {
  return "PUT " + std::to_string(rank) + " " + std::to_string(step) + " " + copyText(copy) + "\n";
}

std::string getLine(int rank, int64_t step) {
  return "GET " + std::to_string(rank) + " " + std::to_string(step) + "\n";
}

std::string haveLine(const CopyHeader& copy) { return "HAVE " + copyText(copy) + "\n"; }

std::string noLine(std::string_view why) {
  std::string line = "NO " + std::string(why.substr(0, kPeerLineMax - 5));
  for (char& c : line)
    if (c == '\n' || c == '\r') c = ' ';
  return line + "\n";
}

PeerRequest parseRequest(std::string_view line) {
  const std::vector<std::string> fields = split(line, ' ');
  const bool put = !fields.empty() && fields[0] == "PUT";
  if (fields.empty() || !(put || fields[0] == "GET") || fields.size() != (put ? 6u : 3u))
    throw ProtocolError("not a checkpoint peer's request: '" + std::string(line.substr(0, 64)) +
                        "'");
  PeerRequest request{.put = put,
                      .rank = number<int>(fields, 1, 0, "rank"),
                      .step = number<int64_t>(fields, 2, 0, "step")};
  if (put) request.copy = copyFields(fields, 3);
  return request;
}

std::optional<CopyHeader> parseAnswer(std::string_view line) {
  if (line == "OK") return std::nullopt;
  if (line.starts_with("NO ")) throw Error(std::string(line.substr(3)));
  const std::vector<std::string> fields = split(line, ' ');
  if (fields.size() != 4 || fields[0] != "HAVE")
    throw ProtocolError("not a checkpoint peer's answer: '" + std::string(line.substr(0, 64)) +
                        "'");
  return copyFields(fields, 1);
}

void CopyChecksum::addTensors(const char* data, size_t bytes) {
  uint64_t sums[64];
  for (size_t at = 0; at + kChecksumBlock <= bytes;) {
    const size_t blocks = std::min<size_t>(std::size(sums), (bytes - at) / kChecksumBlock);
    sumBlocks(data + at, blocks * kChecksumBlock, sums);
    for (size_t i = 0; i < blocks; ++i) {
      sum_ += sums[i];
      weighted_ += sums[i] * ++blocks_;
    }
    at += blocks * kChecksumBlock;
  }
}

void CopyChecksum::setMeta(std::string_view meta) {
  boost::crc_32_type crc;
  crc.process_bytes(meta.data(), meta.size());
  crc_ = crc.checksum();
}

std::string CopyChecksum::text() const {
  char text[41];
  std::snprintf(text, sizeof text, "%016llx%016llx%08x", static_cast<unsigned long long>(sum_),
                static_cast<unsigned long long>(weighted_), crc_);
  return text;
}

}  // namespace dlrun::agents
