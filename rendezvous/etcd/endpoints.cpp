#include "rendezvous/etcd/endpoints.h"

#include "common/error.h"
#include "common/host_port.h"
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
  try {
    static_cast<HostPort&>(endpoint) = parseHostPort(rest, kDefaultPort);
  } catch (const ConfigError& e) {
    throw ConfigError("etcd endpoint '" + std::string(entry) + "': " + e.what());
  }
  return endpoint;
}

}  // namespace
}  // namespace detail

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
