// The store's semantics, driven directly with parsed requests (no sockets).
#include "store/store_engine.h"

#include <gtest/gtest.h>

#include <functional>

namespace dlrun::rendezvous {
namespace {

using wire::Encoder;
using wire::Era;
using wire::Op;

struct RecordingPeer : Peer {
  std::string received;
  void send(std::string_view bytes) override { received.append(bytes); }
  std::string take() { return std::exchange(received, {}); }
};

class EngineTest : public ::testing::Test {
 protected:
  // Encodes, parses and applies one request; returns what the engine refused, if anything.
  template <typename Build>
  std::string run(Peer& peer, Build build) {
    std::string bytes;
    Encoder e(bytes);
    build(e);
    wire::Request request;
    auto parsed = wire::parseRequest(Era::V2, {bytes.data(), bytes.size()}, {}, request);
    EXPECT_EQ(parsed.status, wire::ParseStatus::Complete);
    try {
      engine.handle(peer, request, now);
    } catch (const RequestError& e) {
      return e.what();
    }
    return "";
  }

  // LEASE with `ttl` and tripwires given as key, value, key, value...; expects the ack byte.
  void lease(RecordingPeer& peer, std::string_view key, std::chrono::milliseconds ttl,
             std::vector<std::string_view> tripwires = {}) {
    run(peer, [&](Encoder& e) {
      e.op(Era::V2, Op::Lease).bytes(key).bytes("held").u64(ttl.count()).u64(tripwires.size() / 2);
      for (auto field : tripwires) e.bytes(field);
    });
    EXPECT_EQ(peer.take(), std::string(1, '\0'));
  }

  // The value of a key as GET reads it, or nullopt when CHECK finds it missing.
  std::optional<std::string> read(std::string_view key) {
    RecordingPeer reader;
    run(reader, [&](Encoder& e) { e.op(Era::V2, Op::Check).u64(1).bytes(key); });
    if (reader.take() != std::string(1, '\0')) return std::nullopt;
    run(reader, [&](Encoder& e) { e.op(Era::V2, Op::Get).bytes(key); });
    return reader.take().substr(8);
  }

  void waitOn(Peer& peer, std::string_view key) {
    run(peer, [&](Encoder& e) { e.op(Era::V2, Op::Wait).u64(1).bytes(key); });
  }

  static std::string i64(int64_t v) {
    std::string out;
    Encoder(out).i64(v);
    return out;
  }
  static std::string bytes(std::string_view v) {
    std::string out;
    Encoder(out).bytes(v);
    return out;
  }

  StoreEngine engine;
  StoreEngine::TimePoint now{};
  RecordingPeer a, b;
};

using namespace std::chrono_literals;
const std::string kWoken(1, '\0');

TEST_F(EngineTest, WaitIsAnsweredWhenTheLastKeyAppears) {
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Wait).u64(2).bytes("x").bytes("y"); });
  EXPECT_EQ(a.take(), "");
  run(b, [](Encoder& e) { e.op(Era::V2, Op::Set).bytes("x").bytes("1"); });
  EXPECT_EQ(a.take(), "");
  run(b, [](Encoder& e) { e.op(Era::V2, Op::Add).bytes("y").i64(1); });
  EXPECT_EQ(a.take(), std::string(1, '\0'));
  EXPECT_EQ(engine.waiterCount(), 0u);
}

TEST_F(EngineTest, WaitOnPresentKeysAnswersAtOnce) {
  run(b, [](Encoder& e) { e.op(Era::V2, Op::Set).bytes("x").bytes("1"); });
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Wait).u64(1).bytes("x"); });
  EXPECT_EQ(a.take(), std::string(1, '\0'));
}

TEST_F(EngineTest, CancelWaitForgetsTheWaitAndAnswersCanceled) {
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Wait).u64(1).bytes("x"); });
  run(a, [](Encoder& e) { e.op(Era::V2, Op::CancelWait); });
  EXPECT_EQ(a.take(), std::string(1, '\1'));
  run(b, [](Encoder& e) { e.op(Era::V2, Op::Set).bytes("x").bytes("1"); });
  EXPECT_EQ(a.take(), "");
  EXPECT_EQ(engine.waiterCount(), 0u);
}

TEST_F(EngineTest, DisconnectForgetsWaits) {
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Wait).u64(1).bytes("x"); });
  engine.disconnect(a);
  EXPECT_EQ(engine.waiterCount(), 0u);
  run(b, [](Encoder& e) { e.op(Era::V2, Op::Set).bytes("x").bytes("1"); });
  EXPECT_EQ(a.take(), "");
}

// A store proxy waits for several groups on its one connection: GROUP_WAIT's replies come out
// of turn with their numbers, and every reply after the first GROUP_WAIT is framed.
TEST_F(EngineTest, GroupWaitsAreFramedAndAnsweredByNumber) {
  RecordingPeer proxy, writer;
  run(proxy, [](Encoder& e) { e.op(Era::V2, Op::Add).bytes("n").i64(1); });
  EXPECT_EQ(proxy.take(), i64(1));  // not framed yet
  run(proxy, [](Encoder& e) { e.op(Era::V2, Op::GroupWait).u64(1).bytes("a"); });
  run(proxy, [](Encoder& e) { e.op(Era::V2, Op::GroupWait).u64(1).bytes("b"); });
  run(proxy, [](Encoder& e) { e.op(Era::V2, Op::Add).bytes("n").i64(1); });
  EXPECT_EQ(proxy.take(), std::string(1, '\0') + i64(2));
  run(proxy, [](Encoder& e) { e.op(Era::V2, Op::MultiGet).u64(0); });
  EXPECT_EQ(proxy.take(), "");  // an empty reply stays nothing
  auto wake = [](uint64_t number, wire::WaitReply reply) {
    std::string out;
    Encoder(out).u8(1).u64(number).u8(static_cast<uint8_t>(reply));
    return out;
  };
  run(writer, [](Encoder& e) { e.op(Era::V2, Op::Set).bytes("b").bytes("x"); });
  EXPECT_EQ(proxy.take(), wake(1, wire::WaitReply::StopWaiting));
  run(writer, [](Encoder& e) { e.op(Era::V2, Op::QueuePush).bytes("a").bytes("item"); });
  EXPECT_EQ(proxy.take(), wake(0, wire::WaitReply::StopWaitingOne));
  run(proxy, [](Encoder& e) { e.op(Era::V2, Op::GroupWait).u64(1).bytes("b"); });
  EXPECT_EQ(proxy.take(), wake(2, wire::WaitReply::StopWaiting));  // present: at once
  EXPECT_EQ(writer.take(), "");  // another peer's replies stay as they were
}

// A withdrawn GROUP_WAIT takes no item's wake-up from the waiter behind it.
TEST_F(EngineTest, GroupCancelWithdrawsThatGroupWaitOnly) {
  RecordingPeer proxy, popper, pusher;
  run(proxy, [](Encoder& e) { e.op(Era::V2, Op::GroupWait).u64(1).bytes("q"); });
  run(proxy, [](Encoder& e) { e.op(Era::V2, Op::GroupWait).u64(1).bytes("other"); });
  waitOn(popper, "q");
  run(proxy, [](Encoder& e) { e.op(Era::V2, Op::GroupCancel).u64(0); });
  EXPECT_EQ(proxy.take(), "");  // no reply
  EXPECT_EQ(engine.waiterCount(), 2u);
  run(pusher, [](Encoder& e) { e.op(Era::V2, Op::QueuePush).bytes("q").bytes("item"); });
  EXPECT_EQ(popper.take(), std::string(1, '\0'));
  EXPECT_EQ(proxy.take(), "");
  run(proxy, [](Encoder& e) { e.op(Era::V2, Op::GroupCancel).u64(7); });  // unknown: ignored
  EXPECT_EQ(engine.waiterCount(), 1u);
}

TEST_F(EngineTest, CompareSetFollowsPyTorch) {
  run(a, [](Encoder& e) { e.op(Era::V2, Op::CompareSet).bytes("k").bytes("").bytes("v1"); });
  EXPECT_EQ(a.take(), bytes("v1"));  // missing + empty expected: created
  run(a, [](Encoder& e) { e.op(Era::V2, Op::CompareSet).bytes("m").bytes("e").bytes("v"); });
  EXPECT_EQ(a.take(), bytes("e"));  // missing + non-empty expected: not created
  EXPECT_EQ(engine.keyCount(), 1u);
  run(a, [](Encoder& e) { e.op(Era::V2, Op::CompareSet).bytes("k").bytes("no").bytes("v2"); });
  EXPECT_EQ(a.take(), bytes("v1"));  // mismatch: unchanged
  run(a, [](Encoder& e) { e.op(Era::V2, Op::CompareSet).bytes("k").bytes("v1").bytes("v2"); });
  EXPECT_EQ(a.take(), bytes("v2"));
}

TEST_F(EngineTest, CompareSetOnAMissingKeyWithoutCreatingItWakesNobody) {
  waitOn(a, "k");
  run(b, [](Encoder& e) { e.op(Era::V2, Op::CompareSet).bytes("k").bytes("e").bytes("v"); });
  EXPECT_EQ(a.take(), "");
  run(b, [](Encoder& e) { e.op(Era::V2, Op::CompareSet).bytes("k").bytes("").bytes("v"); });
  EXPECT_EQ(a.take(), kWoken);
}

TEST_F(EngineTest, AddReadsTheLeadingIntegerAsStrtollDoes) {
  const std::vector<std::pair<std::string, int64_t>> cases = {
      {"12abc", 13},
      {" 7", 8},
      {"+4", 5},
      {"0x10", 1},
      {"\n-3\n", -2},
      {"-9223372036854775808", INT64_MIN + 1},
      {"9223372036854775806 ", INT64_MAX}};
  for (const auto& [text, sum] : cases) {
    run(a, [&](Encoder& e) { e.op(Era::V2, Op::Set).bytes("n").bytes(text); });
    EXPECT_EQ(run(a, [](Encoder& e) { e.op(Era::V2, Op::Add).bytes("n").i64(1); }), "") << text;
    EXPECT_EQ(a.take(), i64(sum)) << text;
    EXPECT_EQ(read("n"), std::to_string(sum));
  }
  for (const std::string text :
       {"", " ", "-", "+x", "abc", "99999999999999999999", "-9223372036854775809"}) {
    run(a, [&](Encoder& e) { e.op(Era::V2, Op::Set).bytes("n").bytes(text); });
    EXPECT_NE(run(a, [](Encoder& e) { e.op(Era::V2, Op::Add).bytes("n").i64(1); }), "") << text;
    EXPECT_EQ(read("n"), text);  // refused: unchanged
  }
  EXPECT_EQ(a.take(), "");
}

TEST_F(EngineTest, AddStoresDecimalAndRefusesNonIntegers) {
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Add).bytes("n").i64(40); });
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Add).bytes("n").i64(2); });
  EXPECT_EQ(a.take(), i64(40) + i64(42));
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Get).bytes("n"); });
  EXPECT_EQ(a.take(), bytes("42"));
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Set).bytes("s").bytes("abc"); });
  EXPECT_NE(run(a, [](Encoder& e) { e.op(Era::V2, Op::Add).bytes("s").i64(1); }), "");
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Add).bytes("big").i64(INT64_MAX); });
  EXPECT_NE(run(a, [](Encoder& e) { e.op(Era::V2, Op::Add).bytes("big").i64(1); }), "");
  a.take();
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Get).bytes("big"); });
  EXPECT_EQ(a.take(), bytes(std::to_string(INT64_MAX)));  // a refused ADD changes nothing
}

TEST_F(EngineTest, AppendMultiGetDeleteAndCount) {
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Append).bytes("l").bytes("ab"); });
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Append).bytes("l").bytes("cd"); });
  run(a, [](Encoder& e) { e.op(Era::V2, Op::MultiSet).i64(1).bytes("m").bytes("z"); });
  run(a, [](Encoder& e) { e.op(Era::V2, Op::MultiGet).u64(2).bytes("l").bytes("m"); });
  EXPECT_EQ(a.take(), bytes("abcd") + bytes("z"));
  run(a, [](Encoder& e) { e.op(Era::V2, Op::GetNumKeys); });
  EXPECT_EQ(a.take(), i64(2));
  run(a, [](Encoder& e) { e.op(Era::V2, Op::DeleteKey).bytes("l"); });
  run(a, [](Encoder& e) { e.op(Era::V2, Op::DeleteKey).bytes("l"); });
  EXPECT_EQ(a.take(), i64(1) + i64(0));
}

TEST_F(EngineTest, QueuePushWakesOneBlockedPopper) {
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Wait).u64(1).bytes("q"); });
  run(b, [](Encoder& e) { e.op(Era::V2, Op::Wait).u64(1).bytes("q"); });
  RecordingPeer c;
  run(c, [](Encoder& e) { e.op(Era::V2, Op::QueuePush).bytes("q").bytes("item"); });
  EXPECT_EQ(a.take(), std::string(1, '\0'));
  EXPECT_EQ(b.take(), "");
  run(a, [](Encoder& e) { e.op(Era::V2, Op::QueueLen).bytes("q"); });
  EXPECT_EQ(a.take(), i64(1));
  run(a, [](Encoder& e) { e.op(Era::V2, Op::QueuePop).bytes("q"); });
  EXPECT_EQ(a.take(), i64(1) + bytes("item"));
  run(a, [](Encoder& e) { e.op(Era::V2, Op::QueuePop).bytes("q"); });
  EXPECT_EQ(a.take(), i64(0));
}

TEST_F(EngineTest, LeaseSetsTheKeyAndWakesItsWaiters) {
  waitOn(b, "k");
  lease(a, "k", 1s);
  EXPECT_EQ(b.take(), kWoken);
  EXPECT_EQ(read("k"), "held");
  EXPECT_EQ(engine.leaseCount(), 1u);
}

TEST_F(EngineTest, DisconnectFiresTheLeaseAndWakesTheTripwiresWaiter) {
  lease(a, "k", 1s, {"trip", "a-died"});
  waitOn(b, "trip");
  engine.disconnect(a);
  EXPECT_EQ(b.take(), kWoken);
  EXPECT_EQ(read("k"), std::nullopt);
  EXPECT_EQ(read("trip"), "a-died");
  EXPECT_EQ(engine.leaseCount(), 0u);
  EXPECT_EQ(engine.nextLeaseDeadline(), std::nullopt);
}

TEST_F(EngineTest, ExpiryFiresAtTheDeadlineAndWakesTheTripwiresWaiter) {
  lease(a, "k", 1s, {"trip", "a-silent"});
  EXPECT_EQ(engine.nextLeaseDeadline(), now + 1s);
  waitOn(b, "trip");
  engine.expireLeases(now + 999ms);
  EXPECT_EQ(read("k"), "held");
  EXPECT_EQ(b.take(), "");
  engine.expireLeases(now + 1s);
  EXPECT_EQ(b.take(), kWoken);
  EXPECT_EQ(read("k"), std::nullopt);
  EXPECT_EQ(read("trip"), "a-silent");
  EXPECT_EQ(engine.nextLeaseDeadline(), std::nullopt);
}

TEST_F(EngineTest, EveryRequestOfTheHolderRenewsItsLeasesOnly) {
  const auto start = now;
  lease(a, "k", 1s, {"trip", "x"});
  lease(b, "other", 1s);
  now = start + 800ms;
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Ping).u32(1); });
  EXPECT_EQ(engine.nextLeaseDeadline(), start + 1s);  // b's lease, not renewed
  engine.expireLeases(start + 1s);
  EXPECT_EQ(read("other"), std::nullopt);
  EXPECT_EQ(read("k"), "held");
  EXPECT_EQ(engine.nextLeaseDeadline(), start + 1800ms);
  now = start + 1700ms;
  run(b, [](Encoder& e) { e.op(Era::V2, Op::Ping).u32(1); });  // b's requests do not renew a's
  engine.expireLeases(start + 1800ms);
  EXPECT_EQ(read("k"), std::nullopt);
  EXPECT_EQ(read("trip"), "x");
}

TEST_F(EngineTest, AFiredTripwireKeepsTheFirstWritersValue) {
  run(b, [](Encoder& e) { e.op(Era::V2, Op::Set).bytes("trip").bytes("first"); });
  RecordingPeer c;
  lease(a, "ka", 1s, {"trip", "from-a", "fresh", "from-a"});
  lease(c, "kc", 1s, {"fresh", "from-c"});
  engine.disconnect(a);
  engine.disconnect(c);
  EXPECT_EQ(read("trip"), "first");
  EXPECT_EQ(read("fresh"), "from-a");
}

TEST_F(EngineTest, DeleteKeyReleasesTheLeaseWithoutFiring) {
  lease(a, "k", 1s, {"trip", "x"});
  run(a, [](Encoder& e) { e.op(Era::V2, Op::DeleteKey).bytes("k"); });
  EXPECT_EQ(a.take(), i64(1));
  EXPECT_EQ(engine.leaseCount(), 0u);
  EXPECT_EQ(engine.nextLeaseDeadline(), std::nullopt);
  engine.disconnect(a);
  engine.expireLeases(now + 1h);
  EXPECT_EQ(read("trip"), std::nullopt);
}

TEST_F(EngineTest, SetOnALeasedKeyKeepsTheLease) {
  lease(a, "k", 1s, {"trip", "x"});
  run(b, [](Encoder& e) { e.op(Era::V2, Op::Set).bytes("k").bytes("new"); });
  EXPECT_EQ(read("k"), "new");
  engine.disconnect(a);
  EXPECT_EQ(read("k"), std::nullopt);
  EXPECT_EQ(read("trip"), "x");
}

TEST_F(EngineTest, ALeaseOnALeasedKeyReplacesItWithTheNewOwner) {
  lease(a, "k", 1s, {"trip-a", "x"});
  lease(b, "k", 5s, {"trip-b", "y"});
  EXPECT_EQ(engine.leaseCount(), 1u);
  EXPECT_EQ(engine.nextLeaseDeadline(), now + 5s);
  engine.disconnect(a);
  EXPECT_EQ(read("k"), "held");
  EXPECT_EQ(read("trip-a"), std::nullopt);
  engine.disconnect(b);
  EXPECT_EQ(read("k"), std::nullopt);
  EXPECT_EQ(read("trip-b"), "y");
}

TEST_F(EngineTest, ListKeysListsEveryKeyButNoQueue) {
  run(a, [](Encoder& e) { e.op(Era::V2, Op::ListKeys); });
  EXPECT_EQ(a.take(), i64(0));
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Set).bytes("/x").bytes("1"); });
  run(a, [](Encoder& e) { e.op(Era::V2, Op::QueuePush).bytes("/q").bytes("1"); });
  run(a, [](Encoder& e) { e.op(Era::V2, Op::ListKeys); });
  EXPECT_EQ(a.take(), i64(1) + bytes("/x"));
}

TEST_F(EngineTest, CheckAndWaitSeeAQueueWithItems) {
  run(a, [](Encoder& e) { e.op(Era::V2, Op::QueuePush).bytes("q").bytes("1"); });
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Check).u64(1).bytes("q"); });
  EXPECT_EQ(a.take(), std::string(1, '\0'));  // READY
  waitOn(a, "q");
  EXPECT_EQ(a.take(), kWoken);
}

TEST_F(EngineTest, BarrierAnswersTheLastArrivalAndWakesTheEarlierOnes) {
  RecordingPeer c;
  auto arrive = [&](RecordingPeer& peer) {
    EXPECT_EQ(run(peer, [](Encoder& e) { e.op(Era::V2, Op::Barrier).bytes("b").i64(3); }), "");
  };
  arrive(a);
  EXPECT_EQ(a.take(), "");
  EXPECT_EQ(read("b"), "1");
  arrive(b);  // short of the world size: wakes nobody
  EXPECT_EQ(a.take() + b.take(), "");
  arrive(c);
  EXPECT_EQ(c.take(), kWoken);
  EXPECT_EQ(a.take(), kWoken);
  EXPECT_EQ(b.take(), kWoken);
  EXPECT_EQ(read("b"), "3");
  EXPECT_EQ(engine.waiterCount(), 0u);
  arrive(a);  // past the world size: answered at once
  EXPECT_EQ(a.take(), kWoken);
}

TEST_F(EngineTest, BarrierOfWorldOneOrLessIsAnsweredAtOnce) {
  for (int64_t world : {1, 0, -1}) {
    const std::string key = "w" + std::to_string(world);
    run(a, [&](Encoder& e) { e.op(Era::V2, Op::Barrier).bytes(key).i64(world); });
    EXPECT_EQ(a.take(), kWoken) << world;
  }
}

TEST_F(EngineTest, AnyWriteToTheKeyEndsABarriersWait) {
  const std::vector<std::function<void(Encoder&)>> writes = {
      [](Encoder& e) { e.op(Era::V2, Op::Set).bytes("b").bytes("7"); },
      [](Encoder& e) { e.op(Era::V2, Op::Add).bytes("b").i64(0); },
      [](Encoder& e) { e.op(Era::V2, Op::Append).bytes("b").bytes("0"); },
      [](Encoder& e) { e.op(Era::V2, Op::CompareSet).bytes("b").bytes("no").bytes("x"); },
      [](Encoder& e) { e.op(Era::V2, Op::MultiSet).u64(1).bytes("b").bytes("1"); }};
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Barrier).bytes("b").i64(INT64_MAX); });
  run(b, [](Encoder& e) { e.op(Era::V2, Op::DeleteKey).bytes("b"); });  // no write
  EXPECT_EQ(a.take(), "");
  run(a, [](Encoder& e) { e.op(Era::V2, Op::CancelWait); });
  a.take();
  for (const auto& write : writes) {
    run(a, [](Encoder& e) { e.op(Era::V2, Op::Barrier).bytes("b").i64(INT64_MAX); });
    EXPECT_EQ(a.take(), "");
    run(b, write);
    EXPECT_EQ(a.take(), kWoken);
    b.take();
  }
}

TEST_F(EngineTest, BarrierWaitIsCanceledLikeAWaitAndItsArrivalCounts) {
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Barrier).bytes("b").i64(2); });
  run(a, [](Encoder& e) { e.op(Era::V2, Op::CancelWait); });
  EXPECT_EQ(a.take(), std::string(1, '\1'));  // WAIT_CANCELED
  EXPECT_EQ(engine.waiterCount(), 0u);
  run(b, [](Encoder& e) { e.op(Era::V2, Op::Barrier).bytes("b").i64(2); });
  EXPECT_EQ(b.take(), kWoken);
  EXPECT_EQ(a.take(), "");
}

TEST_F(EngineTest, BarrierCountsLikeAddAndRefusesWhatAddRefuses) {
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Set).bytes("t").bytes("12abc"); });
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Barrier).bytes("t").i64(13); });
  EXPECT_EQ(a.take(), kWoken);
  EXPECT_EQ(read("t"), "13");
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Set).bytes("w").bytes("abc"); });
  EXPECT_NE(run(a, [](Encoder& e) { e.op(Era::V2, Op::Barrier).bytes("w").i64(1); }), "");
  EXPECT_EQ(read("w"), "abc");
  EXPECT_EQ(a.take(), "");
}

TEST_F(EngineTest, TheBarriersFirstArrivalCreatesTheKeyForItsWaiters) {
  waitOn(b, "b");  // dlrun's WAIT returns once the key exists; torch's waits for the last one
  run(a, [](Encoder& e) { e.op(Era::V2, Op::Barrier).bytes("b").i64(2); });
  EXPECT_EQ(b.take(), kWoken);
  EXPECT_EQ(a.take(), "");
}

}  // namespace
}  // namespace dlrun::rendezvous
