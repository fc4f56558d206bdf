// Who may call the control plane (ARCHITECTURE.md section 10). A job started with a token
// (ctl/meta's tokenHash) needs it on every call, as the metadata "authorization: Bearer TOKEN";
// a job started without one may be read by anyone, and stopped or signalled only from this
// host. Pure.
#pragma once

#include <string>
#include <string_view>

namespace dlrun::control {

// The lowercase hex SHA-256 of a job's token, as ctl/meta's tokenHash holds it.
std::string tokenHash(std::string_view token);

// The token in an "authorization" metadata value "Bearer TOKEN" (the scheme in any case);
// empty for no value or another scheme.
std::string_view bearerToken(std::string_view authorization);

// The numeric address in a gRPC peer string ("ipv4:10.0.0.1:5000", "ipv6:[::1]:5000", with
// the brackets percent-encoded or not), an IPv4-mapped IPv6 address as IPv4; empty for any
// other kind of peer.
std::string peerAddress(std::string_view peer);

enum class Access {
  Granted,
  NoToken,     // the job has a token and the call carries none: UNAUTHENTICATED
  WrongToken,  // the call's token is not the job's: UNAUTHENTICATED
  NotLocal,    // a stop or a signal from another host to a job without a token: PERMISSION_DENIED
};

// What a call asks, and from where.
struct Call {
  bool mutating = false;      // StopJob, SignalJob
  bool fromThisHost = false;  // the peer is a loopback address or one of this machine's
};

// `presented`: the call's bearer token (empty: none).
Access access(std::string_view tokenHash, std::string_view presented, Call call);

}  // namespace dlrun::control
