#include "common/host_port.h"

#include "common/error.h"
#include "common/text.h"

namespace dlrun {

std::string HostPort::text() const { return joinHostPort(host, port); }

std::string joinHostPort(std::string_view host, uint16_t port) {
  const std::string shown(host);
  const bool v6 = host.find(':') != std::string_view::npos;
  return (v6 ? "[" + shown + "]" : shown) + ":" + std::to_string(port);
}

HostPort parseHostPort(std::string_view text, uint16_t defaultPort) {
  HostPort parsed{.port = defaultPort};
  std::string_view port;  // after the host's ':', when there is one
  bool hasPort = false;
  if (text.starts_with('[')) {
    const size_t close = text.find(']');
    if (close == std::string_view::npos || close == 1) throw ConfigError("an unclosed or empty [");
    parsed.host = std::string(text.substr(1, close - 1));
    const std::string_view after = text.substr(close + 1);
    if (!after.empty() && after.front() != ':') throw ConfigError("expected :PORT after ]");
    hasPort = !after.empty();
    if (hasPort) port = after.substr(1);
  } else {
    const size_t colon = text.find(':');
    if (colon != std::string_view::npos && text.find(':', colon + 1) != std::string_view::npos)
      throw ConfigError("write an IPv6 address in brackets, as [::1]:" +
                        std::to_string(defaultPort));
    parsed.host = std::string(text.substr(0, colon));
    hasPort = colon != std::string_view::npos;
    if (hasPort) port = text.substr(colon + 1);
  }
  if (parsed.host.empty()) throw ConfigError("no host");
  if (hasPort) {
    const auto number = parseInteger<uint16_t>(port);
    if (!number || *number == 0) throw ConfigError("the port must be 1..65535");
    parsed.port = *number;
  }
  return parsed;
}

}  // namespace dlrun
