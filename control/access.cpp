#include "control/access.h"

#include <algorithm>
#include <cctype>

#include "common/sha256.h"

namespace dlrun::control {

namespace {

bool equalsIgnoringCase(std::string_view a, std::string_view b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](unsigned char x, unsigned char y) {
    return std::tolower(x) == std::tolower(y);
  });
}

// Compares every byte whatever the first difference, so the time taken tells nothing about
// how much of a guess was right.
bool sameHash(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;
  for (size_t i = 0; i < a.size(); ++i)
    difference |= static_cast<unsigned char>(std::tolower(static_cast<unsigned char>(a[i])) ^
                                             std::tolower(static_cast<unsigned char>(b[i])));
  return difference == 0;
}

}  // namespace

std::string tokenHash(std::string_view token) { return sha256Hex(token); }

std::string_view bearerToken(std::string_view authorization) {
  static constexpr std::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size() ||
      !equalsIgnoringCase(authorization.substr(0, kScheme.size()), kScheme))
    return {};
  return authorization.substr(kScheme.size());
}

std::string peerAddress(std::string_view peer) {
  std::string_view host;
  if (peer.starts_with("ipv4:")) {
    host = peer.substr(5, peer.rfind(':') - 5);
  } else if (peer.starts_with("ipv6:")) {
    std::string_view rest = peer.substr(5);
    for (auto [open, close] :
         {std::pair<std::string_view, std::string_view>{"[", "]"}, {"%5B", "%5D"}}) {
      if (!rest.starts_with(open)) continue;
      const size_t end = rest.find(close);
      if (end == std::string_view::npos) return {};
      host = rest.substr(open.size(), end - open.size());
    }
    if (host.starts_with("::ffff:") && host.find('.') != std::string_view::npos)
      host.remove_prefix(7);
  }
  return std::string(host);
}

Access access(std::string_view hash, std::string_view presented, Call call) {
  if (!hash.empty()) {
    if (presented.empty()) return Access::NoToken;
    return sameHash(tokenHash(presented), hash) ? Access::Granted : Access::WrongToken;
  }
  return call.mutating && !call.fromThisHost ? Access::NotLocal : Access::Granted;
}

}  // namespace dlrun::control
