// The wire codec: era detection, one parse per op, limits checked before allocation.
#include "store/wire.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dlrun::wire {
namespace {

std::span<const char> bytesOf(const std::string& s) { return {s.data(), s.size()}; }

ParseResult parse(Era era, const std::string& bytes, Request& out, Limits limits = {}) {
  return parseRequest(era, bytesOf(bytes), limits, out);
}

TEST(Wire, DetectsV2FromValidateAndMagic) {
  std::string hello;
  Encoder(hello).u8(0).u32(kValidationMagic);
  EXPECT_EQ(detectEra(bytesOf(hello)), Era::V2);
  EXPECT_EQ(detectEra(bytesOf(hello.substr(0, 4))), std::nullopt);
  EXPECT_EQ(detectEra(bytesOf("")), std::nullopt);
}

TEST(Wire, DetectsV1FromAnyOtherOpening) {
  std::string set;  // 1.x SET: op 0, then a key length that is not the magic
  Encoder(set).op(Era::V1, Op::Set).bytes("/k").bytes("v");
  EXPECT_EQ(detectEra(bytesOf(set)), Era::V1);
  EXPECT_EQ(detectEra(bytesOf(std::string(1, '\x02'))), Era::V1);
}

TEST(Wire, OpCodesFollowEachEra) {
  EXPECT_EQ(encodeOp(Era::V1, Op::Set), 0);
  EXPECT_EQ(encodeOp(Era::V1, Op::DeleteKey), 8);
  EXPECT_EQ(encodeOp(Era::V2, Op::Validate), 0);
  EXPECT_EQ(encodeOp(Era::V2, Op::Set), 1);
  EXPECT_EQ(encodeOp(Era::V2, Op::DeleteKey), 8);
  EXPECT_EQ(encodeOp(Era::V2, Op::CancelWait), 12);
  EXPECT_EQ(encodeOp(Era::V2, Op::QueueLen), 16);
  EXPECT_EQ(encodeOp(Era::V2, Op::ListKeys), 17);
  EXPECT_EQ(encodeOp(Era::V2, Op::Barrier), 18);
  EXPECT_EQ(decodeOp(Era::V2, 19), std::nullopt);
  EXPECT_EQ(decodeOp(Era::V1, 17), std::nullopt);
  EXPECT_THROW(encodeOp(Era::V1, Op::Barrier), ProtocolError);
  EXPECT_EQ(opName(Op::ListKeys), "LIST_KEYS");
  EXPECT_EQ(opName(Op::Barrier), "BARRIER");
  EXPECT_EQ(decodeOp(Era::V1, 7), Op::WatchKey);
  EXPECT_THROW(encodeOp(Era::V1, Op::Ping), ProtocolError);
  EXPECT_THROW(encodeOp(Era::V2, Op::WatchKey), ProtocolError);
}

TEST(Wire, LeaseIsADlrunExtensionOfV2Only) {
  EXPECT_EQ(encodeOp(Era::V2, Op::Lease), 0x40);
  EXPECT_EQ(decodeOp(Era::V2, 0x40), Op::Lease);
  EXPECT_EQ(decodeOp(Era::V1, 0x40), std::nullopt);
  EXPECT_THROW(encodeOp(Era::V1, Op::Lease), ProtocolError);
  EXPECT_EQ(opName(Op::Lease), "LEASE");
}

TEST(Wire, SpaceOpenAndCloseAreDlrunExtensionsOfV2Only) {
  EXPECT_EQ(encodeOp(Era::V2, Op::SpaceOpen), 0x43);
  EXPECT_EQ(encodeOp(Era::V2, Op::SpaceClose), 0x44);
  EXPECT_EQ(decodeOp(Era::V1, 0x43), std::nullopt);
  EXPECT_EQ(opName(Op::SpaceOpen), "SPACE_OPEN");
  std::string open, close;
  Encoder(open).op(Era::V2, Op::SpaceOpen).bytes("job").i64(7);
  Encoder(close).op(Era::V2, Op::SpaceClose).bytes("job");
  Request r;
  ASSERT_EQ(parse(Era::V2, open, r).status, ParseStatus::Complete);
  EXPECT_EQ(r.keys, std::vector<std::string_view>{"job"});
  EXPECT_EQ(r.number, 7);
  ASSERT_EQ(parse(Era::V2, close, r).status, ParseStatus::Complete);
  EXPECT_EQ(r.keys, std::vector<std::string_view>{"job"});
  const std::string port(8, '\0'), done(1, '\0');
  EXPECT_EQ(replySize(Op::SpaceOpen, 0, bytesOf(port), {}), 8u);
  EXPECT_EQ(replySize(Op::SpaceClose, 0, bytesOf(done), {}), 1u);
}

std::string leaseRequest(uint64_t ttlMs, uint64_t tripwires) {
  std::string bytes;
  Encoder e(bytes);
  e.op(Era::V2, Op::Lease).bytes("node/3").bytes("rec").u64(ttlMs).u64(tripwires);
  for (uint64_t i = 0; i < tripwires; ++i) e.bytes("trip" + std::to_string(i)).bytes("dead");
  return bytes;
}

TEST(Wire, ParsesLeaseThenItsTripwiresAfterTheLeasedKey) {
  const std::string bytes = leaseRequest(5000, 2);
  Request r;
  auto result = parse(Era::V2, bytes, r);
  ASSERT_EQ(result.status, ParseStatus::Complete);
  EXPECT_EQ(result.consumed, bytes.size());
  EXPECT_EQ(r.op, Op::Lease);
  EXPECT_EQ(r.ttlMs, 5000u);
  EXPECT_EQ(r.keys, (std::vector<std::string_view>{"node/3", "trip0", "trip1"}));
  EXPECT_EQ(r.values, (std::vector<std::string_view>{"rec", "dead", "dead"}));
}

TEST(Wire, RejectsALeaseWithoutOrWithAnAbsurdTtl) {
  Request r;
  EXPECT_EQ(parse(Era::V2, leaseRequest(0, 0), r).status, ParseStatus::Invalid);
  auto result = parse(Era::V2, leaseRequest(1001, 0), r, Limits{.maxLeaseTtlMs = 1000});
  EXPECT_EQ(result.status, ParseStatus::Invalid);
  EXPECT_NE(result.error.find("lease TTL 1001 ms"), std::string::npos);
  EXPECT_EQ(parse(Era::V2, leaseRequest(uint64_t{1} << 63, 0), r).status, ParseStatus::Invalid);
}

TEST(Wire, RejectsALeaseWithTooManyTripwires) {
  Request r;
  EXPECT_EQ(parse(Era::V2, leaseRequest(1000, 3), r, Limits{.maxKeysPerOp = 2}).status,
            ParseStatus::Invalid);
}

TEST(Wire, ParsesMultiSetPairsInWireOrder) {
  std::string bytes;
  Encoder(bytes).op(Era::V2, Op::MultiSet).i64(2).bytes("a").bytes("1").bytes("b").bytes("22");
  Request r;
  auto result = parse(Era::V2, bytes, r);
  ASSERT_EQ(result.status, ParseStatus::Complete);
  EXPECT_EQ(result.consumed, bytes.size());
  EXPECT_EQ(r.op, Op::MultiSet);
  EXPECT_EQ(r.keys, (std::vector<std::string_view>{"a", "b"}));
  EXPECT_EQ(r.values, (std::vector<std::string_view>{"1", "22"}));
}

TEST(Wire, ParsesAddKeyThenDelta) {
  std::string bytes;
  Encoder(bytes).op(Era::V1, Op::Add).bytes("/c").i64(-5);
  Request r;
  ASSERT_EQ(parse(Era::V1, bytes, r).status, ParseStatus::Complete);
  EXPECT_EQ(r.keys[0], "/c");
  EXPECT_EQ(r.number, -5);
}

TEST(Wire, ParsesBarrierKeyThenWorldSizeAndListKeysWithoutFields) {
  std::string bytes;
  Encoder(bytes).op(Era::V2, Op::Barrier).bytes("/b").i64(3).op(Era::V2, Op::ListKeys);
  Request r;
  auto first = parse(Era::V2, bytes, r);
  ASSERT_EQ(first.status, ParseStatus::Complete);
  EXPECT_EQ(first.consumed, bytes.size() - 1);
  EXPECT_EQ(r.op, Op::Barrier);
  EXPECT_EQ(r.keys, std::vector<std::string_view>{"/b"});
  EXPECT_EQ(r.number, 3);
  auto second = parse(Era::V2, bytes.substr(first.consumed), r);
  ASSERT_EQ(second.status, ParseStatus::Complete);
  EXPECT_EQ(second.consumed, 1u);
  EXPECT_EQ(r.op, Op::ListKeys);
  EXPECT_TRUE(r.keys.empty());
}

TEST(Wire, EveryPrefixOfARequestIsIncomplete) {
  std::string compareSet;
  Encoder(compareSet).op(Era::V2, Op::CompareSet).bytes("key").bytes("old").bytes("new");
  for (const std::string& bytes : {compareSet, leaseRequest(100, 2)}) {
    Request r;
    for (size_t n = 0; n < bytes.size(); ++n) {
      auto result = parse(Era::V2, bytes.substr(0, n), r);
      EXPECT_EQ(result.status, ParseStatus::Incomplete) << n;
      EXPECT_GT(result.needed, n);
      EXPECT_LE(result.needed, bytes.size());
    }
    EXPECT_EQ(parse(Era::V2, bytes, r).status, ParseStatus::Complete);
  }
}

TEST(Wire, ParsesOnlyTheFirstOfTwoRequests) {
  std::string bytes;
  Encoder(bytes).op(Era::V2, Op::Ping).u32(7);
  const size_t first = bytes.size();
  Encoder(bytes).op(Era::V2, Op::GetNumKeys);
  Request r;
  auto result = parse(Era::V2, bytes, r);
  EXPECT_EQ(result.consumed, first);
  EXPECT_EQ(r.word, 7u);
}

TEST(Wire, RejectsAnOverlongKeyFromItsLengthAlone) {
  std::string bytes;
  Encoder(bytes).op(Era::V2, Op::Get).u64(100);  // the 100 key bytes never follow
  Request r;
  auto result = parse(Era::V2, bytes, r, Limits{.maxKeyBytes = 99});
  EXPECT_EQ(result.status, ParseStatus::Invalid);
  EXPECT_NE(result.error.find("key length 100"), std::string::npos);
}

TEST(Wire, RejectsAHugeLengthPrefix) {
  std::string bytes;
  Encoder(bytes).op(Era::V2, Op::Set).bytes("k").u64(uint64_t{1} << 63);
  Request r;
  EXPECT_EQ(parse(Era::V2, bytes, r).status, ParseStatus::Invalid);
}

TEST(Wire, RejectsTooManyKeys) {
  std::string bytes;
  Encoder(bytes).op(Era::V2, Op::MultiGet).u64(11);
  Request r;
  EXPECT_EQ(parse(Era::V2, bytes, r, Limits{.maxKeysPerOp = 10}).status, ParseStatus::Invalid);
}

TEST(Wire, RejectsUnknownOpsWatchKeyAndABadMagic) {
  Request r;
  EXPECT_EQ(parse(Era::V2, std::string(1, '\x63'), r).status, ParseStatus::Invalid);
  std::string watch;
  Encoder(watch).op(Era::V1, Op::WatchKey).bytes("/k");
  EXPECT_EQ(parse(Era::V1, watch, r).status, ParseStatus::Invalid);
  std::string validate;
  Encoder(validate).op(Era::V2, Op::Validate).u32(0x12345678);
  EXPECT_EQ(parse(Era::V2, validate, r).status, ParseStatus::Invalid);
}

TEST(Wire, EncodesLittleEndianLengthPrefixedBytes) {
  std::string out;
  Encoder(out).op(Era::V2, Op::Ping).u32(0x01020304).bytes("ab");
  EXPECT_EQ(out, std::string("\x0d\x04\x03\x02\x01\x02\0\0\0\0\0\0\0ab", 15));
}

}  // namespace
}  // namespace dlrun::wire
