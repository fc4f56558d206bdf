// The text every dlrun program prints for --version: the project's version and the git commit
// it was built from. Defined in a source generated at every build (cmake/version_info.cmake)
// into a library of its own, dlrun_version, so that a new commit relinks only what prints it.
#pragma once

namespace dlrun {

// "0.1.0 (git 1a2b3c4d5e6f)"; "...-dirty)" when tracked files differed from that commit;
// "(git unknown)" when built outside a git checkout.
extern const char* const kVersion;

}  // namespace dlrun
