// The NCCL unique id's trip through the job's store (the CUDA engine's bootstrap), with threads
// as ranks against a real store server. ncclGetUniqueId needs no GPU, so this runs anywhere
// NCCL is installed.
#include "trainer/nccl_id.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"
#include "store/prefix_store.h"
#include "store/store_server.h"
#include "store/tcp_store.h"

namespace dlrun::trainer {
namespace {

using namespace std::chrono_literals;

std::string bytesOf(const ncclUniqueId& id) {
  return std::string(id.internal, sizeof(id.internal));
}

class NcclIdTest : public ::testing::Test {
 protected:
  // A client of the server under the attempt's prefix, as each rank makes its own.
  std::shared_ptr<Store> rankStore(int attempt) {
    auto tcp = std::make_shared<TcpStore>(
        TcpStoreOptions{.at = {"127.0.0.1", server.port()}, .timeout = 10s});
    return std::make_shared<PrefixStore>("dlrun-train/attempt_" + std::to_string(attempt), tcp);
  }

  // Runs `ranks` threads through shareNcclId, rank 0 last so the others wait in get().
  std::vector<std::string> share(int ranks, int attempt) {
    std::vector<std::string> ids(ranks);
    std::vector<std::thread> threads;
    for (int rank = ranks - 1; rank >= 0; --rank) {
      threads.emplace_back([&, rank, store = rankStore(attempt)] {
        ids[rank] = bytesOf(shareNcclId(*store, rank));
      });
    }
    for (auto& thread : threads) thread.join();
    return ids;
  }

  StoreServerThread server{{.listen = {"127.0.0.1", 0}}};
};

TEST_F(NcclIdTest, EveryRankGetsRankZerosId) {
  const auto ids = share(4, 0);
  ASSERT_EQ(ids[0].size(), size_t{NCCL_UNIQUE_ID_BYTES});  // 128
  for (int rank = 1; rank < 4; ++rank) EXPECT_EQ(ids[rank], ids[0]) << "rank " << rank;
  // Made by ncclGetUniqueId, not left zeroed.
  EXPECT_TRUE(std::any_of(ids[0].begin(), ids[0].end(), [](char c) { return c != 0; }));
}

TEST_F(NcclIdTest, EachAttemptHasItsOwnId) {
  const auto first = share(2, 0);
  const auto second = share(2, 1);
  EXPECT_EQ(second[1], second[0]);
  EXPECT_NE(second[0], first[0]);  // a restarted group never joins the old communicator
}

TEST_F(NcclIdTest, AStoredValueOfTheWrongSizeIsRejected) {
  auto store = rankStore(0);
  store->set("nccl_unique_id", "not an id");
  try {
    shareNcclId(*store, 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nccl_unique_id"), std::string::npos) << e.what();
  }
}

TEST(NcclId, NewIdsDiffer) { EXPECT_NE(bytesOf(newNcclId()), bytesOf(newNcclId())); }

}  // namespace
}  // namespace dlrun::trainer
