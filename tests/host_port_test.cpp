// HOST[:PORT] text: names, IPv4 and bracketed IPv6, the default port, the refusals, and the
// text written back.
#include "common/host_port.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace dlrun {
namespace {

std::string refusal(std::string_view text) {
  try {
    parseHostPort(text, 29400);
  } catch (const ConfigError& error) {
    EXPECT_EQ(std::string(error.what()).find('\n'), std::string::npos);
    return error.what();
  }
  ADD_FAILURE() << "accepted: " << text;
  return "";
}

TEST(HostPort, ParsesHostsPortsAndTheDefault) {
  EXPECT_EQ(parseHostPort("node1", 29400), (HostPort{"node1", 29400}));
  EXPECT_EQ(parseHostPort("node1:5", 29400), (HostPort{"node1", 5}));
  EXPECT_EQ(parseHostPort("10.0.0.1:65535", 1), (HostPort{"10.0.0.1", 65535}));
  EXPECT_EQ(parseHostPort("[::1]:29401", 29400), (HostPort{"::1", 29401}));
  EXPECT_EQ(parseHostPort("[fe80::1%eth0]", 2379), (HostPort{"fe80::1%eth0", 2379}));
}

TEST(HostPort, RefusesWhatNamesNoEndpoint) {
  const std::string brackets = "write an IPv6 address in brackets, as [::1]:29400";
  const std::pair<const char*, std::string> cases[] = {
      {"", "no host"},
      {":29400", "no host"},
      {"::1", brackets},
      {"fe80::1:29400", brackets},  // the last group or a port: it cannot be told
      {"[::1", "an unclosed or empty ["},
      {"[]:1", "an unclosed or empty ["},
      {"[::1]2379", "expected :PORT after ]"}};
  for (const auto& [text, why] : cases) EXPECT_EQ(refusal(text), why) << text;
  for (const char* port : {"h:", "h:0", "h:65536", "h:12x", "h:-1", "[::1]:x"})
    EXPECT_EQ(refusal(port), "the port must be 1..65535") << port;
}

TEST(HostPort, JoinsBracketingIpv6) {
  EXPECT_EQ(joinHostPort("node1", 29400), "node1:29400");
  EXPECT_EQ(joinHostPort("::1", 5), "[::1]:5");
  EXPECT_EQ((HostPort{"10.0.0.1", 2379}).text(), "10.0.0.1:2379");
  EXPECT_EQ((HostPort{"fe80::1%eth0", 7}).text(), "[fe80::1%eth0]:7");
}

TEST(HostPort, WhatIsJoinedParsesBack) {
  for (const HostPort& address : {HostPort{"h", 1}, HostPort{"::1", 29500}, HostPort{"1.2.3.4", 9}})
    EXPECT_EQ(parseHostPort(address.text(), 2), address);
}

}  // namespace
}  // namespace dlrun
