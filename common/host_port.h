// A host and a port as addresses are written: "HOST[:PORT]", an IPv6 address in brackets
// ("[::1]:29400"). The one type of an endpoint from the flag's parser to the socket that dials
// or listens there, the one parser of such text and the one way to write it back, for flags,
// endpoint lists and messages alike. Pure: parsing resolves nothing.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dlrun {

struct HostPort {
  std::string host;  // as written: a name, an IPv4 address, or an IPv6 address without brackets
  uint16_t port = 0;
  // `host` resolved to a numeric address, where the launch resolved it once: what sockets dial
  // or bind, while messages and every later resolution (a store that moved under its name) read
  // `host`. Empty: sockets use `host` itself.
  std::string address;

  const std::string& socketHost() const { return address.empty() ? host : address; }
  // The same endpoint by its name alone, so that each connection resolves it again.
  HostPort named() const { return {host, port}; }
  // "host:port", or "[v6]:port": the host as written.
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
