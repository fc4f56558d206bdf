#include "common/text.h"

#include <cctype>

namespace dlrun {
namespace {

// Python's Template idpattern: [_a-z][_a-z0-9]*, case-insensitively, ASCII only.
size_t identifierLength(std::string_view text) {
  size_t n = 0;
  auto ascii = [](char c) { return static_cast<unsigned char>(c) < 0x80; };
  while (n < text.size() && ascii(text[n]) &&
         (text[n] == '_' || std::isalpha(static_cast<unsigned char>(text[n])) ||
          (n > 0 && std::isdigit(static_cast<unsigned char>(text[n])))))
    ++n;
  return n;
}

}  // namespace

std::vector<std::string> split(std::string_view text, char separator) {
  std::vector<std::string> parts;
  while (true) {
    const size_t end = text.find(separator);
    parts.emplace_back(text.substr(0, end));
    if (end == std::string_view::npos) return parts;
    text.remove_prefix(end + 1);
  }
}

std::string substituteTemplate(std::string_view text,
                               const std::map<std::string, std::string, std::less<>>& values) {
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    const size_t dollar = text.find('$');
    out.append(text.substr(0, dollar));
    if (dollar == std::string_view::npos) break;
    const std::string_view rest = text.substr(dollar + 1);
    const bool braced = rest.starts_with('{');
    const std::string_view afterBrace = rest.substr(braced ? 1 : 0);
    const std::string_view name = afterBrace.substr(0, identifierLength(afterBrace));
    const size_t length = name.size() + (braced ? 2 : 0);  // the name and its braces
    const auto value = values.find(name);
    if (rest.starts_with('$')) {  // $$: a dollar sign
      out += '$';
      text = rest.substr(1);
    } else if (!name.empty() && value != values.end() &&
               (!braced || rest.substr(1 + name.size()).starts_with('}'))) {
      out += value->second;
      text = rest.substr(length);
    } else {  // another name, or none: kept as written
      out += '$';
      text = rest;
    }
  }
  return out;
}

}  // namespace dlrun
