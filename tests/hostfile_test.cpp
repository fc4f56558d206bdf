// Hostfiles and --hosts lists: the formats MPI and DeepSpeed write, and one-line errors naming
// the line or entry for everything else.
#include "remote/hostfile.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dlrun::remote {
namespace {

std::string errorOf(const std::string& text) {
  try {
    parseHostfile(text, "hosts.txt");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::string listErrorOf(const std::string& value) {
  try {
    parseHostList(value);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Hostfile, MpiAndDeepSpeedFormats) {
  const auto hosts = parseHostfile(
      "# the cluster\n"
      "node1 slots=4\n"
      "\n"
      "  node2   slots=2 max_slots=8   # a comment\n"
      "node3\n"
      "10.0.0.4 slots:3\n"
      "root@node5 slots=1\n",
      "hosts.txt");
  ASSERT_EQ(hosts.size(), 5u);
  EXPECT_EQ(hosts[0].name, "node1");
  EXPECT_EQ(hosts[0].slots, 4);
  EXPECT_EQ(hosts[0].where, "hosts.txt line 2");
  EXPECT_EQ(hosts[1].name, "node2");
  EXPECT_EQ(hosts[1].slots, 2);
  EXPECT_EQ(hosts[1].where, "hosts.txt line 4");
  EXPECT_EQ(hosts[2].slots, std::nullopt);
  EXPECT_EQ(hosts[3].name, "10.0.0.4");
  EXPECT_EQ(hosts[3].slots, 3);
  EXPECT_EQ(hosts[4].name, "root@node5");
}

TEST(Hostfile, BadFilesNameTheLine) {
  EXPECT_EQ(errorOf("node1\nnode2 slots=0\n"),
            "hosts.txt line 2: slots '0' is not a whole number from 1 to 1000000");
  EXPECT_EQ(errorOf("node1\nnode1 slots=2\n"),
            "hosts.txt line 2: host 'node1' is listed twice (give it once, with slots=N)");
  EXPECT_EQ(errorOf("node1 cpus=4\n"), "hosts.txt line 1: 'cpus=4' is not slots=N");
  EXPECT_EQ(errorOf("node1 slots=four\n"),
            "hosts.txt line 1: slots 'four' is not a whole number from 1 to 1000000");
  EXPECT_EQ(errorOf("-oProxyCommand=x\n"),
            "hosts.txt line 1: '-oProxyCommand=x' is not a host name");
  EXPECT_EQ(errorOf("no$de\n"), "hosts.txt line 1: 'no$de' is not a host name");
  EXPECT_EQ(errorOf("# nothing\n\n"), "hosts.txt: no host in the file");
}

TEST(HostList, SlotsOrNot) {
  const auto hosts = parseHostList("a:4,b:2,c,[fd00::1]:3");
  ASSERT_EQ(hosts.size(), 4u);
  EXPECT_EQ(hosts[0].name, "a");
  EXPECT_EQ(hosts[0].slots, 4);
  EXPECT_EQ(hosts[1].slots, 2);
  EXPECT_EQ(hosts[2].name, "c");
  EXPECT_EQ(hosts[2].slots, std::nullopt);
  EXPECT_EQ(hosts[3].name, "[fd00::1]");
  EXPECT_EQ(hosts[3].slots, 3);
}

TEST(HostList, BadListsNameTheEntry) {
  EXPECT_EQ(listErrorOf("a:4,a:2"),
            "--hosts entry 2 'a:2': host 'a' is listed twice (give it once, with slots=N)");
  EXPECT_EQ(listErrorOf("a:0"),
            "--hosts entry 1 'a:0': slots '0' is not a whole number from 1 to 1000000");
  EXPECT_EQ(listErrorOf("a,,b"), "--hosts entry 2 '': '' is not a host name");
}

}  // namespace
}  // namespace dlrun::remote
