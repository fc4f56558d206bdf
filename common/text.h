// Small text helpers shared by the parsers of flags, settings and store records (pure).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace dlrun {

// `text` cut at every `separator`: "a,b," gives {"a", "b", ""}, and "" gives {""}.
std::vector<std::string> split(std::string_view text, char separator);

}  // namespace dlrun
