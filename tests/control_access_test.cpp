// Who may call the control plane (control/access.h): a job's token on every call when it has
// one; without one, reads from anywhere and stops or signals from this host only.
#include "control/access.h"

#include <gtest/gtest.h>

#include <cctype>
#include <csignal>

#include "common/signal_name.h"

namespace dlrun::control {
namespace {

TEST(ControlAccess, TokenHashIsHexSha256) {
  // echo -n secret | sha256sum
  EXPECT_EQ(tokenHash("secret"),
            "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b");
}

TEST(ControlAccess, BearerTokenTakesTheSchemeInAnyCase) {
  EXPECT_EQ(bearerToken("Bearer abc"), "abc");
  EXPECT_EQ(bearerToken("bearer abc"), "abc");
  EXPECT_EQ(bearerToken("Basic abc"), "");
  EXPECT_EQ(bearerToken("Bearer "), "");
  EXPECT_EQ(bearerToken(""), "");
}

TEST(ControlAccess, PeerAddressFromGrpcPeerStrings) {
  EXPECT_EQ(peerAddress("ipv4:10.1.2.3:5000"), "10.1.2.3");
  EXPECT_EQ(peerAddress("ipv6:[::1]:5000"), "::1");
  EXPECT_EQ(peerAddress("ipv6:%5B::1%5D:5000"), "::1");
  EXPECT_EQ(peerAddress("ipv6:[::ffff:127.0.0.1]:5000"), "127.0.0.1");
  EXPECT_EQ(peerAddress("unix:/tmp/s"), "");
  EXPECT_EQ(peerAddress("fd:7"), "");
}

TEST(ControlAccess, AJobWithATokenNeedsItOnEveryCall) {
  const std::string hash = tokenHash("secret");
  for (bool mutating : {false, true}) {
    for (bool local : {false, true}) {
      EXPECT_EQ(access(hash, "", {.mutating = mutating, .fromThisHost = local}), Access::NoToken);
      EXPECT_EQ(access(hash, "guess", {.mutating = mutating, .fromThisHost = local}),
                Access::WrongToken);
      EXPECT_EQ(access(hash, "secret", {.mutating = mutating, .fromThisHost = local}),
                Access::Granted);
    }
  }
  std::string upper = hash;
  for (auto& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  EXPECT_EQ(access(upper, "secret", {.mutating = true, .fromThisHost = false}), Access::Granted);
}

TEST(ControlAccess, AJobWithoutATokenIsReadByAnyoneAndStoppedOnlyFromThisHost) {
  EXPECT_EQ(access("", "", {.mutating = false, .fromThisHost = false}), Access::Granted);
  EXPECT_EQ(access("", "", {.mutating = true, .fromThisHost = true}), Access::Granted);
  EXPECT_EQ(access("", "", {.mutating = true, .fromThisHost = false}), Access::NotLocal);
  EXPECT_EQ(access("", "anything", {.mutating = true, .fromThisHost = false}), Access::NotLocal);
}

TEST(SignalName, ParsesNamesAndNumbers) {
  EXPECT_EQ(parseSignal("USR1"), SIGUSR1);
  EXPECT_EQ(parseSignal("SIGUSR1"), SIGUSR1);
  EXPECT_EQ(parseSignal("sigterm"), SIGTERM);
  EXPECT_EQ(parseSignal("10"), 10);
  EXPECT_EQ(parseSignal("0"), std::nullopt);
  EXPECT_EQ(parseSignal("999"), std::nullopt);
  EXPECT_EQ(parseSignal("SIG"), std::nullopt);
  EXPECT_EQ(parseSignal("USR3"), std::nullopt);
  EXPECT_EQ(parseSignal(""), std::nullopt);
  EXPECT_EQ(parseSignal("-1"), std::nullopt);
}

}  // namespace
}  // namespace dlrun::control
