// The etcd endpoint list: defaults, IPv6 in brackets, http:// prefixes, and one-line refusals.
#include "rendezvous/etcd/endpoints.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dlrun::rendezvous::etcd {
namespace {

TEST(EtcdEndpoints, HostsPortsAndDefaults) {
  EXPECT_EQ(parseEndpoints("node1"), (std::vector<Endpoint>{{"node1", 2379}}));
  EXPECT_EQ(parseEndpoints("10.0.0.1:2380, node2 ,node3:1"),
            (std::vector<Endpoint>{{"10.0.0.1", 2380}, {"node2", 2379}, {"node3", 1}}));
  EXPECT_EQ(parseEndpoints("http://a:12379,http://b/"),
            (std::vector<Endpoint>{{"a", 12379}, {"b", 2379}}));
}

TEST(EtcdEndpoints, Ipv6InBrackets) {
  EXPECT_EQ(parseEndpoints("[::1]:2390,[fe80::1%eth0]"),
            (std::vector<Endpoint>{{"::1", 2390}, {"fe80::1%eth0", 2379}}));
  EXPECT_EQ(parseEndpoints("[::1]").front().text(), "[::1]:2379");
  EXPECT_EQ(parseEndpoints("h:7").front().text(), "h:7");
  EXPECT_EQ(describe(parseEndpoints("a,[::1]:5")), "a:2379, [::1]:5");
}

TEST(EtcdEndpoints, RefusalsNameTheEntry) {
  const auto refused = [](const char* list) {
    try {
      parseEndpoints(list);
    } catch (const ConfigError& error) {
      EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos);
      return std::string(error.what());
    }
    ADD_FAILURE() << "accepted: " << list;
    return std::string();
  };
  EXPECT_NE(refused("").find("empty"), std::string::npos);
  EXPECT_NE(refused("a,,b").find("empty"), std::string::npos);
  EXPECT_NE(refused("a,").find("empty"), std::string::npos);
  EXPECT_NE(refused("host:0").find("'host:0'"), std::string::npos);
  EXPECT_NE(refused("host:65536").find("1..65535"), std::string::npos);
  EXPECT_NE(refused("host:12x").find("1..65535"), std::string::npos);
  EXPECT_NE(refused("host:").find("1..65535"), std::string::npos);
  EXPECT_NE(refused(":2379").find("no host"), std::string::npos);
  EXPECT_NE(refused("::1").find("brackets"), std::string::npos);
  EXPECT_NE(refused("[::1").find("unclosed"), std::string::npos);
  EXPECT_NE(refused("[]:1").find("'[]:1'"), std::string::npos);
  EXPECT_NE(refused("[::1]2379").find("after ]"), std::string::npos);
}

TEST(EtcdEndpoints, HttpsMarksTheEndpointForTls) {
  const auto endpoints = parseEndpoints("https://a:12379,b");
  EXPECT_TRUE(endpoints[0].https);
  EXPECT_EQ(endpoints[0].text(), "a:12379");
  EXPECT_FALSE(endpoints[1].https);
}

}  // namespace
}  // namespace dlrun::rendezvous::etcd
