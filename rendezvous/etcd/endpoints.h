// The etcd endpoint list of --rdzv-endpoint: "HOST[:PORT],..." with etcd's client port 2379 by
// default, IPv6 addresses in brackets ("[::1]:2379"), and an optional "http://" before each
// entry as etcdctl's --endpoints writes them. Pure: parsing resolves nothing.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dlrun::rendezvous::etcd {

inline constexpr uint16_t kDefaultPort = 2379;

struct Endpoint {
  std::string host;  // a name, an IPv4 address, or an IPv6 address without brackets
  uint16_t port = kDefaultPort;

  // "host:port", or "[v6]:port": what messages name and what gRPC dials.
  std::string text() const;
  bool operator==(const Endpoint&) const = default;
};

// Throws ConfigError naming the entry: an empty list or entry, a port outside 1..65535, an IPv6
// address without brackets, or https:// (TLS is not supported yet).
std::vector<Endpoint> parseEndpoints(std::string_view list);

// "a:1, b:2": every endpoint for a message.
std::string describe(const std::vector<Endpoint>& endpoints);

}  // namespace dlrun::rendezvous::etcd
