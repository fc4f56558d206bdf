// Bytes this process moved over TCP, as the kernel counts them (TCP_INFO of every TCP socket it
// holds open: bytes acknowledged by the peer, bytes received), so the trainer reports what
// went on the wire whatever library opened the connections (Gloo's pairs, the ps links).
#pragma once

#include <cstdint>

namespace dlrun::trainer {

struct Traffic {
  uint64_t sent = 0;
  uint64_t received = 0;
};

Traffic tcpTraffic();

}  // namespace dlrun::trainer
