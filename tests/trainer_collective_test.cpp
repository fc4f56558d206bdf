// The shared-memory all-reduce, its ranks threads of one process over a MemoryStore: every
// rank gets the sums in rank order, to the bit, also across several chunks; every rank declines
// when one cannot map the segment (as on another machine); a rank waiting for a peer that has
// died, or one that is done, fails at once instead of waiting out the timeout.
#include "trainer/shm_collective.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <random>
#include <thread>

#include "common/error.h"
#include "store/memory_store.h"
#include "store/prefix_store.h"

namespace dlrun::trainer {
namespace {

// Runs body(rank) on a thread per rank and joins them.
void onRanks(int size, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) threads.emplace_back(body, r);
  for (auto& thread : threads) thread.join();
}

std::shared_ptr<Store> jobStore() {
  return std::make_shared<PrefixStore>("job",
                                       std::make_shared<MemoryStore>(std::chrono::seconds(10)));
}

TEST(SharedMemoryCollective, EveryRankGetsTheSumsInRankOrder) {
  constexpr int kSize = 3;
  auto store = jobStore();
  // Odd lengths, and one longer than two chunks of 2^18 floats.
  for (size_t count : {size_t{1}, size_t{1001}, (size_t{1} << 19) + 37}) {
    std::vector<std::vector<float>> values(kSize);
    for (int r = 0; r < kSize; ++r) {
      std::mt19937 random(r);
      std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
      for (size_t i = 0; i < count; ++i) values[r].push_back(uniform(random));
    }
    std::vector<float> expected(count);
    for (size_t i = 0; i < count; ++i) expected[i] = (values[0][i] + values[1][i]) + values[2][i];
    auto results = values;
    onRanks(kSize, [&](int rank) {
      auto prefixed = std::make_shared<PrefixStore>(std::to_string(count), store);
      auto collective = makeSharedMemoryCollective(*prefixed, rank, kSize);
      ASSERT_NE(collective, nullptr);
      EXPECT_EQ(collective->rank(), rank);
      EXPECT_EQ(collective->size(), kSize);
      collective->allreduceSum(results[rank].data(), count);
    });
    for (int r = 0; r < kSize; ++r) EXPECT_EQ(results[r], expected) << "rank " << r;
  }
}

// Names a segment that does not exist, as a rank on another machine would find.
class ElsewhereStore : public PrefixStore {
 public:
  using PrefixStore::PrefixStore;
  std::string get(const std::string& key) override {
    return key == "shm_segment" ? "/dlrun-train-elsewhere 0" : PrefixStore::get(key);
  }
};

TEST(SharedMemoryCollective, DeclinedByEveryRankWhenOneCannotMapIt) {
  auto memory = std::make_shared<MemoryStore>(std::chrono::seconds(10));
  onRanks(3, [&](int rank) {
    std::unique_ptr<Store> store;
    if (rank == 2)
      store = std::make_unique<ElsewhereStore>("job", memory);
    else
      store = std::make_unique<PrefixStore>("job", memory);
    EXPECT_EQ(makeSharedMemoryCollective(*store, rank, 3), nullptr) << "rank " << rank;
  });
}

// Rank 0 sums while rank 1 leaves without summing; rank 0 must fail within a second or so.
void expectPeerGoneFailsAtOnce(const std::function<void(std::unique_ptr<Collective>)>& leave) {
  auto store = jobStore();
  std::unique_ptr<Collective> collectives[2];
  onRanks(2, [&](int rank) { collectives[rank] = makeSharedMemoryCollective(*store, rank, 2); });
  ASSERT_NE(collectives[0], nullptr);
  ASSERT_NE(collectives[1], nullptr);
  std::thread([&] { leave(std::move(collectives[1])); }).join();
  float value = 1.0f;
  const auto start = std::chrono::steady_clock::now();
  try {
    collectives[0]->allreduceSum(&value, 1);
    FAIL() << "the sum completed without rank 1";
  } catch (const TimeoutError& e) {
    FAIL() << "waited out the timeout: " << e.what();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "rank 1 exited in the middle of an all-reduce");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(SharedMemoryCollective, APeerThatDiedFailsTheWaitingRank) {
  // A thread that ends holding its robust mutex is what a killed process leaves behind.
  expectPeerGoneFailsAtOnce(
      [](std::unique_ptr<Collective> peer) { [[maybe_unused]] auto* leaked = peer.release(); });
}

TEST(SharedMemoryCollective, APeerThatIsDoneFailsTheWaitingRank) {
  expectPeerGoneFailsAtOnce([](std::unique_ptr<Collective> peer) { peer.reset(); });
}

}  // namespace
}  // namespace dlrun::trainer
