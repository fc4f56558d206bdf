#include "rendezvous/etcd/endpoints.h"


#include "common/error.h"
#include "common/text.h"

namespace dlrun::rendezvous::etcd {
namespace detail {
namespace {

std::string_view trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(" \t");
  return text.substr(first, last - first + 1);
}

uint16_t parsePort(std::string_view text, std::string_view entry) {
  const auto value = parseInteger<uint16_t>(text);
  if (!value || *value == 0)
    throw ConfigError("etcd endpoint '" + std::string(entry) + "': the port must be 1..65535");
  return *value;
}

Endpoint parseEntry(std::string_view entry) {
  std::string_view rest = entry;
  Endpoint endpoint;
  if (rest.starts_with("https://")) {
    rest.remove_prefix(8);
    endpoint.https = true;
  } else if (rest.starts_with("http://")) {
    rest.remove_prefix(7);
  }
  if (rest.ends_with("/")) rest.remove_suffix(1);
  if (rest.empty()) throw ConfigError("etcd endpoint '" + std::string(entry) + "': no host");
  if (rest.front() == '[') {
    const auto close = rest.find(']');
    if (close == std::string_view::npos || close == 1) {
      throw ConfigError("etcd endpoint '" + std::string(entry) + "': unclosed or empty [");
    }
    endpoint.host = std::string(rest.substr(1, close - 1));
    const auto after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') {
        throw ConfigError("etcd endpoint '" + std::string(entry) + "': expected :PORT after ]");
      }
      endpoint.port = parsePort(after.substr(1), entry);
    }
    return endpoint;
  }
  const auto colon = rest.find(':');
  if (colon != std::string_view::npos && rest.find(':', colon + 1) != std::string_view::npos) {
    throw ConfigError("etcd endpoint '" + std::string(entry) +
                      "': write an IPv6 address in brackets, as [::1]:2379");
  }
  endpoint.host = std::string(rest.substr(0, colon));
  if (endpoint.host.empty()) {
    throw ConfigError("etcd endpoint '" + std::string(entry) + "': no host");
  }
  if (colon != std::string_view::npos) endpoint.port = parsePort(rest.substr(colon + 1), entry);
  return endpoint;
}

}  // namespace
}  // namespace detail

std::string Endpoint::text() const {
  const std::string shown = host.find(':') == std::string::npos ? host : "[" + host + "]";
  return shown + ":" + std::to_string(port);
}

std::vector<Endpoint> parseEndpoints(std::string_view list) {
  std::vector<Endpoint> endpoints;
  if (detail::trim(list).empty()) throw ConfigError("etcd endpoints: the list is empty");
  for (const std::string& part : split(list, ',')) {
    const auto entry = detail::trim(part);
    if (entry.empty()) {
      throw ConfigError("etcd endpoints '" + std::string(list) + "': an entry is empty");
    }
    endpoints.push_back(detail::parseEntry(entry));
  }
  return endpoints;
}

std::string describe(const std::vector<Endpoint>& endpoints) {
  std::string text;
  for (const auto& endpoint : endpoints) {
    if (!text.empty()) text += ", ";
    text += endpoint.text();
  }
  return text;
}

}  // namespace dlrun::rendezvous::etcd
