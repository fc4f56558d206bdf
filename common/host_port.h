// A host and a port as addresses are written: "HOST[:PORT]", an IPv6 address in brackets
// ("[::1]:29400"). The one parser of such text and the one way to write it back, for flags,
// endpoint lists and messages alike. Pure: parsing resolves nothing.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dlrun {

struct HostPort {
  std::string host;  // a name, an IPv4 address, or an IPv6 address without brackets
  uint16_t port = 0;

  // "host:port", or "[v6]:port".
  std::string text() const;
  bool operator==(const HostPort&) const = default;
};

// "host:port", with an IPv6 address (any host with a ':') in brackets ("[::1]:29500").
std::string joinHostPort(std::string_view host, uint16_t port);

// "HOST", "HOST:PORT", "[V6]" or "[V6]:PORT"; without a port, `defaultPort`. The port must be
// 1..65535 (an endpoint is dialled, so 0 names nothing). An IPv6 address must be in brackets:
// without them its last group cannot be told from a port. Throws ConfigError saying only what is
// wrong ("no host"): the caller puts the flag and the text before it.
HostPort parseHostPort(std::string_view text, uint16_t defaultPort);

}  // namespace dlrun
