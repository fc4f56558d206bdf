#include "launcher/dlrund_cli.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dlrun::launcher {
namespace {

TEST(DlrundCli, DefaultsMatchTorchrunsStorePort) {
  auto parsed = parseDlrundArgs({});
  EXPECT_FALSE(parsed.exitCode);
  EXPECT_EQ(parsed.config.server.listen.port, 29500);
  EXPECT_EQ(parsed.config.server.listen.host, "0.0.0.0");
  EXPECT_TRUE(parsed.config.control);
  EXPECT_FALSE(parsed.config.stats);
}

TEST(DlrundCli, ReadsEveryFlag) {
  auto parsed = parseDlrundArgs({"--host", "::", "--port", "0", "--max-key-bytes", "10",
                                 "--max-value-bytes", "20", "--max-keys-per-op", "30",
                                 "--max-buffered-bytes", "40", "--no-control", "--stats", "-v"});
  const auto& c = parsed.config;
  EXPECT_EQ(c.server.listen.host, "::");
  EXPECT_EQ(c.server.listen.port, 0);
  EXPECT_EQ(c.server.limits.maxKeyBytes, 10u);
  EXPECT_EQ(c.server.limits.maxValueBytes, 20u);
  EXPECT_EQ(c.server.limits.maxKeysPerOp, 30u);
  EXPECT_EQ(c.server.limits.maxBufferedBytes, 40u);
  EXPECT_FALSE(c.control);
  EXPECT_TRUE(c.stats);
  EXPECT_TRUE(c.verbose);
}

TEST(DlrundCli, BadInputIsAConfigErrorNamingTheFlag) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--port", "abc"}, {"--port", "70000"}, {"--max-key-bytes", "0"}, {"--bogus"}}) {
    try {
      parseDlrundArgs(args);
      ADD_FAILURE() << "accepted " << args[0];
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(args[0]), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace dlrun::launcher
