// The network probe between a round's nodes (docs/guides/health-checks.md): once a round of
// several nodes forms, before its workers start, each node's agent measures its link to the
// next node's (a round trip of a few bytes, then PROBE_BYTES sent and acknowledged) and the
// round's first node names the slowest link, and any clock far off its neighbour's, on stderr
// and in the events. Bounded by --network-probe-timeout; off with --no-network-probe.
//
// Wire (binary, on a port of the agent's own): the prober sends 'T' and is answered 'T' and the
// answering node's wall clock (8 bytes, big-endian nanoseconds since the epoch), a few times;
// then 'D', a 4-byte big-endian length and that many bytes, answered 'A' once all arrived.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/asio.h"

namespace dlrun::agents {

namespace asio = boost::asio;

inline constexpr uint32_t kProbeBytes = 4u << 20;
inline constexpr uint32_t kProbeMaxBytes = 64u << 20;  // a longer 'D' is refused
inline constexpr int kProbePings = 5;
// Clocks further apart than this are named: events and logs from different nodes stop lining up.
inline constexpr std::chrono::milliseconds kClockSkewLimit{500};
// A node that takes longer to reach the store (one request) is named: every
// rendezvous, restart and worker's store call pays it.
inline constexpr std::chrono::milliseconds kStoreSlowLimit{250};

// One node's link to the next, as the first measured it.
struct LinkMeasure {
  std::string from, to;                // node names
  std::optional<std::string> problem;  // set: nothing measured ("connection refused", ...)
  double roundTripMs = 0;              // the median ping
  double megabytesPerSecond = 0;       // PROBE_BYTES over the time they took, less a round trip
  double sendSeconds = 0;              // what moving PROBE_BYTES took, acknowledged
  double clockAheadMs = 0;             // `to`'s clock less `from`'s, at the fastest ping
  double storeMs = 0;                  // `from` to the store: one request

  std::string encode() const;  // JSON, for Rendezvous::shareWithRound
  // Throws NetworkError on text that is not one.
  static LinkMeasure decode(const std::string& text);
};

// What a round's links say, one line each (pure): the slowest link against the round's median,
// links not measured, clocks off by more than kClockSkewLimit, nodes slower than kStoreSlowLimit
// to reach the store. Empty for no links.
std::vector<std::string> describeLinks(const std::vector<LinkMeasure>& links);

// Answers probes on `host` (as the other nodes reach this one), any free port, on `io`: the
// agent's loop. Throws NetworkError when it cannot listen.
class ProbeServer {
 public:
  ProbeServer(asio::io_context& io, const std::string& host);
  ~ProbeServer();
  ProbeServer(const ProbeServer&) = delete;
  ProbeServer& operator=(const ProbeServer&) = delete;

  std::string address() const;  // "HOST:PORT"

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// Measures the link from this node to the agent at `address` ("HOST:PORT"), sending `bytes`;
// blocks until done or `deadline`, when the measure says what it did not finish.
LinkMeasure probeLink(const std::string& from, const std::string& to, const std::string& address,
                      uint32_t bytes, std::chrono::steady_clock::time_point deadline);

}  // namespace dlrun::agents
