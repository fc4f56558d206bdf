// Who listens on a TCP port of this machine, for the message about a port that is taken (the
// store's port on a shared node, --metrics-port): the listening socket's inode from
// /proc/net/tcp and tcp6, the process from the /proc/PID/fd that links to it. Only processes this
// one may look into are found (its own user's, or every one for root).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dlrun {

// The inode of the socket in state LISTEN on local port `port` in a /proc/net/tcp or tcp6
// table (its text), or nullopt. Pure.
std::optional<uint64_t> listeningInode(std::string_view table, uint16_t port);

// "PID 1234, python3" for the process listening on `port` here, or nullopt where it cannot be
// known (nobody listens, or the holder is another user's).
std::optional<std::string> portHolder(uint16_t port);

}  // namespace dlrun
