// Numeric addresses: dlrun publishes and compares addresses, never names, so every node sees
// the same text for the same host (ARCHITECTURE.md section 5).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/clock.h"

namespace dlrun {

// The numeric form of a host name or address (resolved once, first answer wins).
// Throws NetworkError naming `what` when it does not resolve.
std::string resolveNumeric(const std::string& host, const std::string& what);

// resolveNumeric, patient with a name that does not resolve yet (no such name, or no answer:
// the pod behind it is not ready, its DNS record not yet made): tries again with back-off (50 ms
// doubling to 2 s) until `deadline`, calling `waiting(the resolver's error)` once, at the first
// miss. Other errors, and a miss at the deadline, throw NetworkError naming `what`.
std::string resolveNumericWaiting(const std::string& host, const std::string& what,
                                  Clock::time_point deadline,
                                  const std::function<void(const std::string&)>& waiting);

// The local address this machine uses to reach host:port (the route's source address).
// Nothing is sent. Throws NetworkError when there is no route.
std::string localAddressToward(const std::string& host, uint16_t port);

// Whether a numeric address belongs to this machine (it can be bound).
bool isLocalAddress(const std::string& address);

// Distinct free TCP ports on `host`, found by binding port 0; all are held until every one is
// chosen, then released for the workers to bind.
std::vector<uint16_t> reserveFreePorts(const std::string& host, int count);

}  // namespace dlrun
