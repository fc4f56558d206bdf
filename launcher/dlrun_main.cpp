// dlrun: the launcher and per-node agent. Parses torchrun's flags and runs the workers.
#include "common/log.h"
#include "common/cli.h"
#include "launcher/launch.h"
#include "launcher/launch_cli.h"

int main(int argc, char** argv) {
  using namespace dlrun;
  log::setProgramName("dlrun");
  return guardedMain([&] {
    auto parsed = launcher::parseDlrunArgs(std::vector<std::string>(argv + 1, argv + argc),
                                           launcher::HostProbe::real());
    if (parsed.exitCode) return *parsed.exitCode;
    return launcher::launch(parsed.config);
  });
}
