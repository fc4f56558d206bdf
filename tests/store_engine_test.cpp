// The store's semantics, driven directly with parsed requests (no sockets).
#include "rendezvous/store_engine.h"

#include <gtest/gtest.h>

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
    return engine.handle(peer, request);
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
  RecordingPeer a, b;
};

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

}  // namespace
}  // namespace dlrun::rendezvous
