// Who may connect to the store (issue 32): the job's nodes as the launcher learns them, plus
// the networks of --store-allow (dlrund --allow). Pure: parsing and matching, no I/O, no Asio.
// An empty rule admits everyone, as the store did before admission existed; the first host or
// network admitted makes it admit only those. Loopback is no exception: a launcher that fills
// the rule adds its own addresses (and 127.0.0.1, ::1) itself.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace dlrun {

// An IP address in IPv6 form, IPv4 as IPv4-mapped (::ffff:a.b.c.d): one comparison serves
// both families, and a dual-stack listener's mapped peers match IPv4 rules.
using IpBytes = std::array<uint8_t, 16>;

class AdmissionRule {
 public:
  AdmissionRule() = default;  // admits everyone

  // "10.0.0.0/8,127.0.0.1,::1,fd00::/8": IPv4 and IPv6 networks, a bare address being one
  // host; spaces around entries are ignored, host bits past the prefix too (10.1.2.3/8 is
  // 10.0.0.0/8). An empty list admits everyone. Throws ConfigError naming `flag` and the bad
  // entry.
  static AdmissionRule parse(std::string_view list, std::string_view flag);

  // A numeric IPv4 or IPv6 address in IPv6 form; nullopt for anything else (names included).
  static std::optional<IpBytes> address(std::string_view text);

  // Admits one more host. Not thread-safe: the store server calls it on its own thread
  // (StoreServer::allow posts there), so its owner never calls it directly once serving.
  void add(const IpBytes& host);

  bool allows(const IpBytes& peer) const;
  bool empty() const { return hosts_.empty() && networks_.empty(); }
  // The flag the rule was parsed from ("--allow"), for the line logged about a refused peer;
  // empty when no flag filled it.
  const std::string& flag() const { return flag_; }

 private:
  struct Network {
    IpBytes base;  // host bits cleared
    int prefix;    // leading bits that must match, 0..128
  };

  std::set<IpBytes> hosts_;  // single hosts: one lookup however many nodes the job has
  std::vector<Network> networks_;
  std::string flag_;
};

}  // namespace dlrun
