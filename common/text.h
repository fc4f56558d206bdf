// Small text helpers shared by the parsers of flags, settings and store records (pure).
#pragma once

#include <charconv>
#include <concepts>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlrun {

// `text` cut at every `separator`: "a,b," gives {"a", "b", ""}, and "" gives {""}.
std::vector<std::string> split(std::string_view text, char separator);

// `text` as a T when the whole of it is one decimal integer that T can hold, else nullopt: no
// sign but a '-' (and none for an unsigned T, where strtoul would wrap "-1"), no spaces, no
// trailing characters, no empty string, nothing out of range. Callers check their own bounds.
template <std::integral T>
std::optional<T> parseInteger(std::string_view text) {
  T value{};
  const char* end = text.data() + text.size();
  const auto [at, error] = std::from_chars(text.data(), end, value);
  if (text.empty() || error != std::errc() || at != end) return std::nullopt;
  return value;
}

// Python's string.Template(text).safe_substitute(values), as torch expands its templates (worker
// arguments, the console prefix): `$name` and `${name}` become the value where `values` has the
// name, `$$` becomes `$`, anything else stays as written.
std::string substituteTemplate(std::string_view text,
                               const std::map<std::string, std::string, std::less<>>& values);

}  // namespace dlrun
