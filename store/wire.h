// The TCPStore wire vocabulary: op codes of both PyTorch eras, limits, era detection, the
// request parser and the byte encoder. Pure functions over byte spans, no I/O, so the server,
// the client, the benchmark and the fuzzer share one definition of the protocol.
//
// Framing (PyTorch TCPStore): a request is one uint8 op code then its fields. A string or byte
// array is a uint64 length then the bytes; integers are raw little-endian.
//
// Eras:
//  - V1, PyTorch 1.x (tested against Debian's torch 1.13) and 2.0/2.1: no handshake,
//    SET=0 COMPARE_SET=1 GET=2 ADD=3 CHECK=4 WAIT=5 GETNUMKEYS=6 WATCH_KEY=7 DELETE_KEY=8,
//    and from 2.0 APPEND=9 MULTI_GET=10 MULTI_SET=11 CANCEL_WAIT=12.
//  - V2, PyTorch 2.x from the VALIDATE handshake on, numbering of
//    torch/csrc/distributed/c10d/TCPStoreBackend.hpp as of release v2.13: VALIDATE=0 (+ uint32
//    magic 0x3C85F7CE, the first request of every connection, no reply) SET=1 COMPARE_SET=2
//    GET=3 ADD=4 CHECK=5 WAIT=6 GETNUMKEYS=7 DELETE_KEY=8 APPEND=9 MULTI_GET=10 MULTI_SET=11
//    CANCEL_WAIT=12 PING=13, from v2.8 QUEUE_PUSH=14 QUEUE_POP=15 QUEUE_LEN=16, and from
//    v2.13 LIST_KEYS=17 (no fields; replies int64 n, then n keys: the whole store's) and
//    BARRIER=18 (key, int64 world size; counts arrivals in the key like ADD, replies
//    STOP_WAITING once the count reaches the world size, to every arrival waiting till then).
// dlrun extension, V2 only, at a code no PyTorch era uses (a torch server refuses it):
//    LEASE=64 (0x40): key, value, uint64 ttl_ms, uint64 n, then n (tripwire key, tripwire value)
//    pairs; replies one uint8 0. Sets key=value and ties it to the connection: every request on
//    the connection renews the lease for ttl_ms; when the connection closes or the ttl lapses
//    the server deletes the key and sets each tripwire key that does not exist yet.
//    GROUP_WAIT=65 (0x41): WAIT's fields and meaning, for a store proxy waiting for a group of
//    its clients at once; replies STOP_WAITING when a write made the keys exist (every client
//    may go on), STOP_WAITING_ONE when a QUEUE_PUSH woke it (one client may: the store wakes one
//    waiter per item). So that a proxy needs one connection, whatever it waits on, the reply
//    comes out of turn and framed: from its first GROUP_WAIT on, every reply on the connection
//    is a FramedReply byte, then for InOrder the reply as usual (in request order; an empty
//    one, MULTI_GET's of no keys, stays nothing at all), for
//    GroupWait the GROUP_WAIT's number on the connection (uint64, from 0) and its one byte.
//    GROUP_CANCEL=66 (0x42): uint64 number; withdraws that GROUP_WAIT if it still waits. No
//    reply (a wake already sent still arrives).
//    SPACE_OPEN=67 (0x43): key (a group: a job's run id), int64 attempt; replies uint64 port.
//    Each attempt of a job gets a key space of its own behind a port of its own (the workers'
//    MASTER_PORT), on the address the store listens on: every connection to that port sees only
//    the space's keys. The group's newest attempt wins: opening a later attempt closes the
//    group's space (its port, its connections, its keys); opening the open one returns its
//    port; opening an earlier one opens nothing and replies port 0. Not on a space's own port.
//    SPACE_CLOSE=68 (0x44): key (a group); closes the group's space if one is open; replies one
//    uint8 0. Not on a space's own port.
// A connection whose first five bytes are VALIDATE + magic speaks V2; any other opening is V1.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dlrun::wire {

enum class Era : uint8_t { V1, V2 };

// Era-independent names for the operations; the numbering on the wire depends on the era.
enum class Op : uint8_t {
  Validate,
  Set,
  CompareSet,
  Get,
  Add,
  Check,
  Wait,
  GetNumKeys,
  WatchKey,
  DeleteKey,
  Append,
  MultiGet,
  MultiSet,
  CancelWait,
  Ping,
  QueuePush,
  QueuePop,
  QueueLen,
  ListKeys,
  Barrier,
  Lease,
  GroupWait,
  GroupCancel,
  SpaceOpen,
  SpaceClose,
};
inline constexpr size_t kOpCount = static_cast<size_t>(Op::SpaceClose) + 1;

std::optional<Op> decodeOp(Era era, uint8_t code);
uint8_t encodeOp(Era era, Op op);  // throws ProtocolError for an op the era lacks
std::string_view opName(Op op);

inline constexpr uint32_t kValidationMagic = 0x3C85F7CE;

enum class CheckReply : uint8_t { Ready = 0, NotReady = 1 };
enum class WaitReply : uint8_t { StopWaiting = 0, WaitCanceled = 1, StopWaitingOne = 2 };
enum class FramedReply : uint8_t { InOrder = 0, GroupWait = 1 };

// Checked on every length field before anything is allocated for it.
struct Limits {
  uint64_t maxKeyBytes = 8 * 1024;
  uint64_t maxValueBytes = 16 * 1024 * 1024;
  uint64_t maxKeysPerOp = 128 * 1024;
  // A lease's TTL is a keep-alive interval: a day is far beyond any sane one, and the bound
  // keeps now + ttl from overflowing the clock.
  uint64_t maxLeaseTtlMs = 24 * 60 * 60 * 1000;
  // Input waiting to be parsed plus output waiting to be sent, per connection.
  uint64_t maxBufferedBytes = 64 * 1024 * 1024;
};

// Decides the era from a connection's first bytes; nullopt while too few bytes have arrived.
// When the answer is V2 the opening VALIDATE request is still in `in` for the parser.
std::optional<Era> detectEra(std::span<const char> in);

// One parsed request. Views point into the parsed buffer and live as long as it does.
struct Request {
  Op op = Op::Ping;
  std::vector<std::string_view> keys;    // every op's key(s), in wire order; LEASE: the
                                         // leased key, then its tripwire keys
  std::vector<std::string_view> values;  // SET/APPEND/QUEUE_PUSH: 1; COMPARE_SET: expected,
                                         // desired; MULTI_SET and LEASE: one per key
  int64_t number = 0;                    // ADD's delta, BARRIER's world size, GROUP_CANCEL's
                                         // GROUP_WAIT number, SPACE_OPEN's attempt
  uint64_t ttlMs = 0;                    // LEASE's time to live
  uint32_t word = 0;                     // VALIDATE's magic, PING's nonce

  void clear();
};

enum class ParseStatus { Complete, Incomplete, Invalid };

struct ParseResult {
  ParseStatus status;
  size_t consumed = 0;  // bytes of the request when Complete
  size_t needed = 0;    // when Incomplete: the size known so far that `in` must reach first
  std::string error;    // what is wrong when Invalid
};

// Parses the first request in `in`. Incomplete means more bytes are needed; Invalid means the
// peer broke the protocol or a limit, and the connection should be dropped.
ParseResult parseRequest(Era era, std::span<const char> in, const Limits& limits, Request& out);

// The size of the store's reply to `op` (with `keys` keys) at the start of `in`: 0 for an op
// that has no reply (SET, APPEND, MULTI_SET, QUEUE_PUSH, VALIDATE), nullopt while `in` holds
// too few bytes. Replies are alike in both eras. Throws ProtocolError for a length beyond
// `limits` (a reply no store sends).
std::optional<size_t> replySize(Op op, size_t keys, std::span<const char> in, const Limits& limits);

// Appends wire fields to a byte string: used for replies and for client requests alike.
class Encoder {
 public:
  explicit Encoder(std::string& out) : out_(out) {}
  Encoder& op(Era era, Op op);
  Encoder& u8(uint8_t value);
  Encoder& u32(uint32_t value);
  Encoder& u64(uint64_t value);
  Encoder& i64(int64_t value);
  Encoder& bytes(std::string_view value);  // uint64 length, then the bytes

 private:
  std::string& out_;
};

// Reads little-endian integers from raw bytes (for clients decoding replies).
uint64_t loadU64(const char* bytes);
uint32_t loadU32(const char* bytes);

}  // namespace dlrun::wire
