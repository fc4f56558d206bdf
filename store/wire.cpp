#include "store/wire.h"

#include <array>
#include <cstring>

#include "common/error.h"

namespace dlrun::wire {
namespace {

constexpr uint8_t kNoCode = 0xFF;

// Wire code of each Op (indexed by Op) per era; kNoCode where the era lacks the op.
constexpr size_t kOps = kOpCount;
constexpr std::array<uint8_t, kOps> kV1Codes = {
    kNoCode, 0,       1,       2,       3,       4,       5,       6,       7,
    8,       9,       10,      11,      12,      kNoCode, kNoCode, kNoCode, kNoCode,
    kNoCode, kNoCode, kNoCode, kNoCode, kNoCode, kNoCode, kNoCode};
constexpr std::array<uint8_t, kOps> kV2Codes = {0,  1,  2,    3,    4,    5,    6,   7,  kNoCode,
                                                8,  9,  10,   11,   12,   13,   14,  15, 16,
                                                17, 18, 0x40, 0x41, 0x42, 0x43, 0x44};

constexpr std::array<std::string_view, kOps> kNames = {
    "VALIDATE",   "SET",        "COMPARE_SET",  "GET",         "ADD",
    "CHECK",      "WAIT",       "GETNUMKEYS",   "WATCH_KEY",   "DELETE_KEY",
    "APPEND",     "MULTI_GET",  "MULTI_SET",    "CANCEL_WAIT", "PING",
    "QUEUE_PUSH", "QUEUE_POP",  "QUEUE_LEN",    "LIST_KEYS",   "BARRIER",
    "LEASE",      "GROUP_WAIT", "GROUP_CANCEL", "SPACE_OPEN",  "SPACE_CLOSE"};

const std::array<uint8_t, kOps>& codes(Era era) { return era == Era::V1 ? kV1Codes : kV2Codes; }

// Walks a request's fields. Every read either succeeds, reports that more bytes are needed, or
// records why the request is invalid; lengths are checked against the limits before use.
class Cursor {
 public:
  Cursor(std::span<const char> in, const Limits& limits) : in_(in), limits_(limits) {}

  bool ok() const { return status_ == ParseStatus::Complete; }
  size_t needed() const { return needed_; }
  ParseStatus status() const { return status_; }
  size_t position() const { return pos_; }
  std::string& error() { return error_; }

  bool u32(uint32_t& value) {
    if (!need(4)) return false;
    value = loadU32(in_.data() + pos_);
    pos_ += 4;
    return true;
  }

  bool u64(uint64_t& value) {
    if (!need(8)) return false;
    value = loadU64(in_.data() + pos_);
    pos_ += 8;
    return true;
  }

  bool count(uint64_t& value) {
    if (!u64(value)) return false;
    if (value > limits_.maxKeysPerOp)
      return invalid("key count " + std::to_string(value) + " exceeds the limit of " +
                     std::to_string(limits_.maxKeysPerOp));
    return true;
  }

  bool ttl(uint64_t& value) {
    if (!u64(value)) return false;
    if (value == 0 || value > limits_.maxLeaseTtlMs)
      return invalid("lease TTL " + std::to_string(value) + " ms is not between 1 and " +
                     std::to_string(limits_.maxLeaseTtlMs));
    return true;
  }

  bool key(std::string_view& value) { return field(value, limits_.maxKeyBytes, "key"); }
  bool value(std::string_view& value) { return field(value, limits_.maxValueBytes, "value"); }

  bool invalid(std::string message) {
    if (status_ == ParseStatus::Complete) {
      status_ = ParseStatus::Invalid;
      error_ = std::move(message);
    }
    return false;
  }

 private:
  bool need(uint64_t n) {
    if (!ok()) return false;
    if (in_.size() - pos_ >= n) return true;
    status_ = ParseStatus::Incomplete;
    needed_ = pos_ + n;
    return false;
  }

  bool field(std::string_view& out, uint64_t limit, const char* what) {
    uint64_t length = 0;
    if (!u64(length)) return false;
    if (length > limit)
      return invalid(std::string(what) + " length " + std::to_string(length) +
                     " exceeds the limit of " + std::to_string(limit));
    if (!need(length)) return false;
    out = std::string_view(in_.data() + pos_, length);
    pos_ += length;
    return true;
  }

  std::span<const char> in_;
  const Limits& limits_;
  size_t pos_ = 0;
  size_t needed_ = 0;
  ParseStatus status_ = ParseStatus::Complete;
  std::string error_;
};

bool parseKeys(Cursor& c, Request& out) {
  uint64_t n = 0;
  if (!c.count(n)) return false;
  for (uint64_t i = 0; i < n; ++i) {
    if (!c.key(out.keys.emplace_back())) return false;
  }
  return true;
}

// A count, then that many (key, value) pairs.
bool parsePairs(Cursor& c, Request& out) {
  uint64_t n = 0;
  if (!c.count(n)) return false;
  for (uint64_t i = 0; i < n; ++i) {
    if (!c.key(out.keys.emplace_back()) || !c.value(out.values.emplace_back())) return false;
  }
  return true;
}

bool parseBody(Cursor& c, Request& out) {
  switch (out.op) {
    case Op::Validate:
      if (!c.u32(out.word)) return false;
      return out.word == kValidationMagic || c.invalid("VALIDATE with a wrong magic number");
    case Op::Ping: return c.u32(out.word);
    case Op::Set:
    case Op::Append:
    case Op::QueuePush: return c.key(out.keys.emplace_back()) && c.value(out.values.emplace_back());
    case Op::CompareSet:
      return c.key(out.keys.emplace_back()) && c.value(out.values.emplace_back()) &&
             c.value(out.values.emplace_back());
    case Op::Get:
    case Op::DeleteKey:
    case Op::QueuePop:
    case Op::QueueLen:
    case Op::WatchKey:
    case Op::SpaceClose: return c.key(out.keys.emplace_back());
    case Op::Add:
    case Op::Barrier:
    case Op::SpaceOpen:
      if (!c.key(out.keys.emplace_back())) return false;
      [[fallthrough]];
    case Op::GroupCancel: {  // then ADD's delta, BARRIER's world size, GROUP_CANCEL's number,
                             // SPACE_OPEN's attempt
      uint64_t number = 0;
      if (!c.u64(number)) return false;
      out.number = static_cast<int64_t>(number);
      return true;
    }
    case Op::Check:
    case Op::Wait:
    case Op::GroupWait:
    case Op::MultiGet: return parseKeys(c, out);
    case Op::MultiSet: return parsePairs(c, out);
    case Op::Lease:
      return c.key(out.keys.emplace_back()) && c.value(out.values.emplace_back()) &&
             c.ttl(out.ttlMs) && parsePairs(c, out);
    case Op::GetNumKeys:
    case Op::CancelWait:
    case Op::ListKeys: return true;
  }
  return c.invalid("unhandled op");
}

}  // namespace

std::optional<Op> decodeOp(Era era, uint8_t code) {
  const auto& table = codes(era);
  for (size_t i = 0; i < table.size(); ++i) {
    if (table[i] == code) return static_cast<Op>(i);
  }
  return std::nullopt;
}

uint8_t encodeOp(Era era, Op op) {
  uint8_t code = codes(era)[static_cast<size_t>(op)];
  if (code == kNoCode)
    throw ProtocolError(std::string(opName(op)) + " does not exist in this protocol era");
  return code;
}

std::string_view opName(Op op) { return kNames[static_cast<size_t>(op)]; }

std::optional<Era> detectEra(std::span<const char> in) {
  if (in.empty()) return std::nullopt;
  if (in[0] != 0) return Era::V1;
  if (in.size() < 5) return std::nullopt;
  return loadU32(in.data() + 1) == kValidationMagic ? Era::V2 : Era::V1;
}

void Request::clear() {
  keys.clear();
  values.clear();
  number = 0;
  ttlMs = 0;
  word = 0;
}

ParseResult parseRequest(Era era, std::span<const char> in, const Limits& limits, Request& out) {
  out.clear();
  if (in.empty()) return {ParseStatus::Incomplete, 0, 1, {}};
  const auto code = static_cast<uint8_t>(in[0]);
  auto op = decodeOp(era, code);
  if (!op) return {ParseStatus::Invalid, 0, 0, "unknown op code " + std::to_string(code)};
  out.op = *op;
  Cursor c(in.subspan(1), limits);
  if (out.op == Op::WatchKey) c.invalid("WATCH_KEY is not supported");
  parseBody(c, out);
  if (c.status() == ParseStatus::Incomplete) return {c.status(), 0, 1 + c.needed(), {}};
  if (c.status() == ParseStatus::Invalid) return {c.status(), 0, 0, std::move(c.error())};
  return {ParseStatus::Complete, 1 + c.position(), 0, {}};
}

Encoder& Encoder::op(Era era, Op op) { return u8(encodeOp(era, op)); }

Encoder& Encoder::u8(uint8_t value) {
  out_.push_back(static_cast<char>(value));
  return *this;
}

Encoder& Encoder::u32(uint32_t value) {
  char raw[4];
  std::memcpy(raw, &value, 4);  // x86-64 and aarch64 are little-endian, as the wire is
  out_.append(raw, 4);
  return *this;
}

Encoder& Encoder::u64(uint64_t value) {
  char raw[8];
  std::memcpy(raw, &value, 8);
  out_.append(raw, 8);
  return *this;
}

Encoder& Encoder::i64(int64_t value) { return u64(static_cast<uint64_t>(value)); }

Encoder& Encoder::bytes(std::string_view value) {
  u64(value.size());
  out_.append(value);
  return *this;
}

namespace {

// Adds the size of one length-prefixed field at `at` to `size`; false while incomplete.
bool addField(std::span<const char> in, size_t& size, uint64_t limit) {
  if (in.size() < size + 8) return false;
  const uint64_t length = loadU64(in.data() + size);
  if (length > limit) throw ProtocolError("a reply field of " + std::to_string(length) + " bytes");
  size += 8 + length;
  return in.size() >= size;
}

}  // namespace

std::optional<size_t> replySize(Op op, size_t keys, std::span<const char> in,
                                const Limits& limits) {
  size_t size = 0;
  switch (op) {
    case Op::Validate:
    case Op::Set:
    case Op::Append:
    case Op::MultiSet:
    case Op::QueuePush:
    case Op::GroupCancel: return 0;
    case Op::Check:
    case Op::Wait:
    case Op::GroupWait:
    case Op::CancelWait:
    case Op::Barrier:
    case Op::Lease:
    case Op::WatchKey:
    case Op::SpaceClose: size = 1; break;
    case Op::Ping: size = 4; break;
    case Op::Add:
    case Op::GetNumKeys:
    case Op::DeleteKey:
    case Op::QueueLen:
    case Op::SpaceOpen: size = 8; break;
    case Op::Get:
    case Op::CompareSet:
      return addField(in, size, limits.maxValueBytes) ? std::optional(size) : std::nullopt;
    case Op::MultiGet:
      for (size_t i = 0; i < keys; ++i)
        if (!addField(in, size, limits.maxValueBytes)) return std::nullopt;
      return size;
    case Op::QueuePop:    // the length before the pop, then the item when there was one
    case Op::ListKeys: {  // a count, then that many keys
      if (in.size() < 8) return std::nullopt;
      const auto count = static_cast<int64_t>(loadU64(in.data()));
      size = 8;
      const uint64_t items =
          op == Op::QueuePop ? (count > 0 ? 1 : 0) : static_cast<uint64_t>(count);
      if (count < 0 || items > limits.maxKeysPerOp * 64)
        throw ProtocolError("a reply of " + std::to_string(count) + " items");
      for (uint64_t i = 0; i < items; ++i)
        if (!addField(in, size, limits.maxValueBytes)) return std::nullopt;
      return size;
    }
  }
  return in.size() >= size ? std::optional(size) : std::nullopt;
}

uint64_t loadU64(const char* bytes) {
  uint64_t value;
  std::memcpy(&value, bytes, 8);
  return value;
}

uint32_t loadU32(const char* bytes) {
  uint32_t value;
  std::memcpy(&value, bytes, 4);
  return value;
}

}  // namespace dlrun::wire
