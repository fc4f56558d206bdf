// Files a program ships with (the trainer's AVX2 module, dlrun-tls): beside the program in a build
// tree; once installed, in a directory of the package, named relative to the program's own
// directory. Both are found from /proc/self/exe, so an installed tree works wherever it is put.
#pragma once

#include <string>
#include <string_view>

namespace dlrun {

// The path of `name` beside this program, else in `installedDir` (relative to the program's
// directory); empty when neither holds it.
std::string findProgramFile(std::string_view name, std::string_view installedDir);

}  // namespace dlrun
