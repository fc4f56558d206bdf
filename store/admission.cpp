#include "store/admission.h"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>
#include <cstring>

#include "common/error.h"

namespace dlrun {

namespace {

constexpr int kMappedPrefix = 96;  // the bits of ::ffff: in front of an IPv4 address

std::string_view trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

// Clears every bit past the first `prefix`, so matching compares bytes as they are.
IpBytes masked(IpBytes bytes, int prefix) {
  for (int bit = prefix; bit < 128; ++bit)
    bytes[bit / 8] &= static_cast<uint8_t>(~(0x80 >> (bit % 8)));
  return bytes;
}

bool matches(const IpBytes& peer, const IpBytes& base, int prefix) {
  const int whole = prefix / 8;
  if (std::memcmp(peer.data(), base.data(), whole) != 0) return false;
  if (prefix % 8 == 0) return true;
  const auto mask = static_cast<uint8_t>(0xff00 >> (prefix % 8));
  return (peer[whole] & mask) == base[whole];
}

}  // namespace

std::optional<IpBytes> AdmissionRule::address(std::string_view text) {
  const std::string copy(text);  // inet_pton reads a terminated string
  IpBytes bytes{};
  if (::inet_pton(AF_INET6, copy.c_str(), bytes.data()) == 1) return bytes;
  in_addr v4{};
  if (::inet_pton(AF_INET, copy.c_str(), &v4) != 1) return std::nullopt;
  bytes[10] = bytes[11] = 0xff;
  std::memcpy(bytes.data() + 12, &v4, 4);
  return bytes;
}

AdmissionRule AdmissionRule::parse(std::string_view list, std::string_view flag) {
  AdmissionRule rule;
  rule.flag_ = std::string(flag);
  if (trim(list).empty()) return rule;
  const auto bad = [&](const std::string& why) {
    return ConfigError(std::string(flag) + ": " + why +
                       " (give addresses or CIDR networks, e.g. 10.0.0.0/8,127.0.0.1,::1)");
  };
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string_view entry = trim(list.substr(start, comma - start));
    start = comma + 1;
    if (entry.empty()) throw bad("an empty entry in '" + std::string(list) + "'");
    const size_t slash = entry.find('/');
    const auto host = address(entry.substr(0, slash));
    if (!host)
      throw bad("'" + std::string(entry.substr(0, slash)) + "' is not a numeric IP address");
    const bool v4 = entry.substr(0, slash).find(':') == std::string_view::npos;
    int prefix = 128;
    if (slash != std::string_view::npos) {
      const std::string_view bits = entry.substr(slash + 1);
      const int most = v4 ? 32 : 128;
      const auto [end, ec] = std::from_chars(bits.data(), bits.data() + bits.size(), prefix);
      if (bits.empty() || ec != std::errc() || end != bits.data() + bits.size() || prefix < 0 ||
          prefix > most)
        throw bad("'" + std::string(entry) + "' has a prefix length other than 0.." +
                  std::to_string(most));
      if (v4) prefix += kMappedPrefix;
    }
    if (prefix == 128) {
      rule.hosts_.insert(*host);
    } else {
      rule.networks_.push_back({masked(*host, prefix), prefix});
    }
  }
  return rule;
}

void AdmissionRule::add(const IpBytes& host) { hosts_.insert(host); }

bool AdmissionRule::allows(const IpBytes& peer) const {
  if (empty() || hosts_.contains(peer)) return true;
  return std::any_of(networks_.begin(), networks_.end(), [&](const Network& network) {
    return matches(peer, network.base, network.prefix);
  });
}

}  // namespace dlrun
