// The real PyTorch 1.13 C++ client (Debian's libtorch) against the server, for the ops that
// torch 1.13's Python binding does not expose (CHECK) and for 1.x wait semantics.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <thread>

#include "store/store_server.h"

namespace dlrun::rendezvous {
namespace {

using namespace std::chrono_literals;

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// libtorch 2.x's clients ask for libuv by default, which a build without it (Debian 13's libtorch
// 2.6) refuses; a client does the same work either way. libtorch 1.x has no such option.
template <typename Options>
void withoutLibuv(Options& options) {
  if constexpr (requires { options.useLibUV; }) options.useLibUV = false;
}

class TorchClientTest : public ::testing::Test {
 protected:
  std::unique_ptr<c10d::TCPStore> client() {
    c10d::TCPStoreOptions options;
    options.port = server.port();
    options.isServer = false;
    options.waitWorkers = false;
    options.timeout = 10s;
    withoutLibuv(options);
    return std::make_unique<c10d::TCPStore>("127.0.0.1", options);
  }
  StoreServerThread server{StoreServerOptions{.listen = {"127.0.0.1", 0}}};
};

TEST_F(TorchClientTest, CheckReportsPresentAndMissingKeys) {
  auto store = client();
  EXPECT_FALSE(store->check({"k"}));
  store->set("k", bytes("v"));
  store->set("j", bytes("w"));
  EXPECT_TRUE(store->check({"k"}));
  EXPECT_TRUE(store->check({"k", "j"}));
  EXPECT_FALSE(store->check({"k", "missing"}));
}

TEST_F(TorchClientTest, WaitOnSeveralKeysEndsWhenTheLastIsSet) {
  auto waiter = client(), setter = client();
  std::thread t([&] {
    setter->set("a", bytes("1"));
    setter->add("b", 1);
  });
  waiter->wait({"a", "b"}, 10s);
  t.join();
  EXPECT_EQ(waiter->get("b"), bytes("1"));
}

TEST_F(TorchClientTest, AfterATimedOutWaitTheClientStillWorks) {
  auto store = client();
  EXPECT_THROW(store->wait({"never"}, 200ms), std::exception);
  store->set("x", bytes("y"));
  EXPECT_EQ(store->get("x"), bytes("y"));
  EXPECT_EQ(store->add("n", 2), 2);
  EXPECT_TRUE(store->check({"x", "n"}));
}

}  // namespace
}  // namespace dlrun::rendezvous
