// Reading JSON records that other agents wrote to the store: anything malformed is a
// ProtocolError naming what was read. Shared by the records' codecs (rendezvous/elastic_protocol,
// control/state/control_state).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "common/error.h"

namespace dlrun::json_fields {

using nlohmann::json;

inline json parse(std::string_view text, const char* what) {
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!value.is_object()) throw ProtocolError(std::string("malformed ") + what + " in the store");
  return value;
}

template <typename T>
T field(const json& object, const char* name, const char* what) {
  auto it = object.find(name);
  if (it == object.end()) throw ProtocolError(std::string(what) + " lacks '" + name + "'");
  try {
    return it->get<T>();
  } catch (const json::exception&) {
    throw ProtocolError(std::string(what) + " has a malformed '" + name + "'");
  }
}

}  // namespace dlrun::json_fields
