// AdmissionRule: the lists --allow and --store-allow take, and which peers they admit.
#include "store/admission.h"

#include <gtest/gtest.h>

#include <map>

#include "common/error.h"

namespace dlrun {
namespace {

IpBytes ip(std::string_view text) {
  const auto bytes = AdmissionRule::address(text);
  EXPECT_TRUE(bytes) << text;
  return bytes.value_or(IpBytes{});
}

std::string refusal(std::string_view list) {
  try {
    AdmissionRule::parse(list, "--allow");
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "accepted '" << list << "'";
  return "";
}

TEST(Admission, AnEmptyRuleAdmitsEveryone) {
  for (const AdmissionRule& rule : {AdmissionRule(), AdmissionRule::parse("", "--allow"),
                                    AdmissionRule::parse(" ", "--allow")}) {
    EXPECT_TRUE(rule.empty());
    EXPECT_TRUE(rule.allows(ip("10.1.2.3")));
    EXPECT_TRUE(rule.allows(ip("2001:db8::1")));
  }
}

TEST(Admission, IPv4NetworksAndHosts) {
  const auto rule = AdmissionRule::parse("10.0.0.0/8, 192.168.1.7,172.16.0.0/12", "--allow");
  EXPECT_FALSE(rule.empty());
  EXPECT_EQ(rule.flag(), "--allow");
  EXPECT_TRUE(rule.allows(ip("10.255.0.1")));
  EXPECT_FALSE(rule.allows(ip("11.0.0.1")));
  EXPECT_TRUE(rule.allows(ip("192.168.1.7")));
  EXPECT_FALSE(rule.allows(ip("192.168.1.8")));
  EXPECT_TRUE(rule.allows(ip("172.31.255.255")));  // /12 ends mid-byte
  EXPECT_FALSE(rule.allows(ip("172.32.0.0")));
  EXPECT_FALSE(rule.allows(ip("127.0.0.1")));  // loopback only when listed
}

TEST(Admission, IPv6AndMappedPeers) {
  const auto rule = AdmissionRule::parse("::1,fd00::/8,10.0.0.0/8", "--store-allow");
  EXPECT_TRUE(rule.allows(ip("::1")));
  EXPECT_TRUE(rule.allows(ip("fdab:1::5")));
  EXPECT_FALSE(rule.allows(ip("fe80::1")));
  // A dual-stack listener sees IPv4 peers as ::ffff:a.b.c.d: IPv4 rules match them.
  EXPECT_EQ(ip("::ffff:10.1.2.3"), ip("10.1.2.3"));
  EXPECT_TRUE(rule.allows(ip("::ffff:10.1.2.3")));
  EXPECT_FALSE(rule.allows(ip("::ffff:11.1.2.3")));
  // An IPv4 rule is no IPv6 one: ::10.1.2.3 (IPv4-compatible) is another address.
  EXPECT_FALSE(rule.allows(ip("::10.1.2.3")));
}

TEST(Admission, EdgesOfThePrefix) {
  EXPECT_TRUE(AdmissionRule::parse("0.0.0.0/0", "--allow").allows(ip("203.0.113.9")));
  EXPECT_FALSE(AdmissionRule::parse("0.0.0.0/0", "--allow").allows(ip("2001:db8::1")));
  EXPECT_TRUE(AdmissionRule::parse("::/0", "--allow").allows(ip("2001:db8::1")));
  const auto host = AdmissionRule::parse("10.0.0.1/32,2001:db8::1/128", "--allow");
  EXPECT_TRUE(host.allows(ip("10.0.0.1")));
  EXPECT_FALSE(host.allows(ip("10.0.0.2")));
  EXPECT_TRUE(host.allows(ip("2001:db8::1")));
  EXPECT_FALSE(host.allows(ip("2001:db8::2")));
  // Host bits past the prefix are ignored, as firewalls do.
  EXPECT_TRUE(AdmissionRule::parse("10.1.2.3/8", "--allow").allows(ip("10.9.9.9")));
}

TEST(Admission, AddAdmitsOneMoreHost) {
  auto rule = AdmissionRule::parse("10.0.0.0/8", "--allow");
  EXPECT_FALSE(rule.allows(ip("192.0.2.5")));
  rule.add(ip("192.0.2.5"));
  EXPECT_TRUE(rule.allows(ip("192.0.2.5")));
  EXPECT_FALSE(rule.allows(ip("192.0.2.6")));
  // Adding to an empty rule makes it admit only what was added.
  AdmissionRule nodes;
  nodes.add(ip("::1"));
  EXPECT_TRUE(nodes.allows(ip("::1")));
  EXPECT_FALSE(nodes.allows(ip("127.0.0.1")));
  EXPECT_EQ(nodes.flag(), "");
}

TEST(Admission, AddressesAreNumericOnly) {
  EXPECT_FALSE(AdmissionRule::address("localhost"));
  EXPECT_FALSE(AdmissionRule::address("10.0.0.256"));
  EXPECT_FALSE(AdmissionRule::address(""));
  EXPECT_TRUE(AdmissionRule::address("127.0.0.1"));
}

TEST(Admission, BadListsAreOneLineNamingTheFlagAndTheEntry) {
  const std::map<std::string, std::string> cases = {
      {"10.0.0.0/8,bogus", "'bogus'"},  {"node1", "'node1'"},
      {"10.0.0.0/33", "'10.0.0.0/33'"}, {"::1/129", "'::1/129'"},
      {"10.0.0.0/", "'10.0.0.0/'"},     {"10.0.0.0/8x", "'10.0.0.0/8x'"},
      {"10.0.0.0/-1", "'10.0.0.0/-1'"}, {"10.0.0.1,,::1", "empty"},
      {"10.0.0.1,", "empty"},           {"1.2.3.4/8/8", "'1.2.3.4/8/8'"}};
  for (const auto& [list, mention] : cases) {
    const std::string message = refusal(list);
    EXPECT_EQ(message.rfind("--allow: ", 0), 0u) << message;
    EXPECT_NE(message.find(mention), std::string::npos) << list << ": " << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace dlrun
