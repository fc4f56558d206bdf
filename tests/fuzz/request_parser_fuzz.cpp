// libFuzzer target: arbitrary bytes as one connection's input. Era detection, the request
// parser and the engine must never crash, read out of bounds, or allocate beyond the limits.
#include <cstddef>
#include <cstdint>

#include "store/store_engine.h"
#include "store/wire.h"

namespace {

struct DiscardingPeer : dlrun::Peer {
  size_t bytes = 0;
  void send(std::string_view reply) override { bytes += reply.size(); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace dlrun;
  // Small limits so the fuzzer reaches the limit checks with short inputs.
  const wire::Limits limits{
      .maxKeyBytes = 64, .maxValueBytes = 256, .maxKeysPerOp = 16, .maxBufferedBytes = 4096};
  std::span<const char> in(reinterpret_cast<const char*>(data), size);
  auto era = wire::detectEra(in);
  if (!era) return 0;
  StoreEngine engine;
  DiscardingPeer peer;
  wire::Request request;
  // Time moves a little with every request, so leases also expire on the way.
  StoreEngine::TimePoint now{};
  while (!in.empty()) {
    auto result = wire::parseRequest(*era, in, limits, request);
    if (result.status != wire::ParseStatus::Complete) break;
    if (result.consumed == 0 || result.consumed > in.size()) __builtin_trap();
    now += std::chrono::milliseconds(100);
    engine.expireLeases(now);
    try {
      engine.handle(peer, request, now);
    } catch (const RequestError&) {
      break;
    }
    in = in.subspan(result.consumed);
  }
  engine.disconnect(peer);
  // A gone peer leaves no waiter and no lease behind.
  if (engine.waiterCount() != 0 || engine.leaseCount() != 0) __builtin_trap();
  return 0;
}
