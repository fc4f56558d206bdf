// The etcd endpoint list of --rdzv-endpoint: "HOST[:PORT],..." with etcd's client port 2379 by
// default, IPv6 addresses in brackets ("[::1]:2379"), and an optional "http://" before each
// entry as etcdctl's --endpoints writes them, or "https://" (TLS). Pure: parsing resolves
// nothing.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/host_port.h"

namespace dlrun::rendezvous::etcd {

inline constexpr uint16_t kDefaultPort = 2379;

// An etcd member's host and port (text(): what messages name and what gRPC dials), and its scheme.
struct Endpoint : HostPort {
  bool https = false;  // written "https://": the client dials every endpoint over TLS

  bool operator==(const Endpoint&) const = default;
};

// Throws ConfigError naming the entry: an empty list or entry, a port outside 1..65535, an IPv6
// address without brackets.
std::vector<Endpoint> parseEndpoints(std::string_view list);

// How the client proves who it is, and whom it trusts. TLS is on when `tls` is set (a CA was
// given, or an endpoint was written https://): every endpoint is dialled over TLS, since one
// cluster serves all its members the same way. An empty rootCerts trusts the system's CAs.
struct EtcdSecurity {
  bool tls = false;
  std::string rootCerts;   // PEM of the CA(s) that signed etcd's server certificates
  std::string certChain;   // PEM of the client certificate, for --client-cert-auth
  std::string privateKey;  // PEM of its key
  // etcd's user/password authentication (Auth.Authenticate); empty user: none.
  std::string user;
  std::string password;
  bool operator==(const EtcdSecurity&) const = default;
};

// "a:1, b:2": every endpoint for a message.
std::string describe(const std::vector<Endpoint>& endpoints);

}  // namespace dlrun::rendezvous::etcd
