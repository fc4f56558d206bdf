#pragma once

namespace dlrun::launcher {
inline constexpr const char* kVersion = "0.1.0";
}
