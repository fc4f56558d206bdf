// Numeric addresses: dlrun publishes and compares addresses, never names, so every node sees
// the same text for the same host (ARCHITECTURE.md section 5).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dlrun {

// The numeric form of a host name or address (resolved once, first answer wins).
// Throws NetworkError naming `what` when it does not resolve.
std::string resolveNumeric(const std::string& host, const std::string& what);

// The local address this machine uses to reach host:port (the route's source address).
// Nothing is sent. Throws NetworkError when there is no route.
std::string localAddressToward(const std::string& host, uint16_t port);

// Whether a numeric address belongs to this machine (it can be bound).
bool isLocalAddress(const std::string& address);

// Distinct free TCP ports on `host`, found by binding port 0; all are held until every one is
// chosen, then released for the workers to bind.
std::vector<uint16_t> reserveFreePorts(const std::string& host, int count);

}  // namespace dlrun
