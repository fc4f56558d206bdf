// SHA-256 (FIPS 180-4), for the control plane's token hash. Written here rather than taken from
// OpenSSL so that no dlrun process loads OpenSSL unless it dials etcd over TLS: loading it costs
// every agent 0.65 ms of CPU at start (its relocations), a rendezvous of many agents on few cores
// waits on that. Pure.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace dlrun {

std::array<std::uint8_t, 32> sha256(std::string_view data);

// The digest as 64 lowercase hex digits.
std::string sha256Hex(std::string_view data);

}  // namespace dlrun
