// dlrun: the launcher and per-node agent. Parses torchrun's flags and runs the workers.
#include "common/error.h"
#include "common/log.h"
#include "launcher/launch.h"
#include "launcher/launch_cli.h"

int main(int argc, char** argv) {
  using namespace dlrun;
  log::setProgramName("dlrun");
  try {
    auto parsed = launcher::parseDlrunArgs(std::vector<std::string>(argv + 1, argv + argc),
                                           launcher::HostProbe::real());
    if (parsed.exitCode) return *parsed.exitCode;
    return launcher::launch(parsed.config);
  } catch (const ConfigError& e) {
    log::info(std::string("error: ") + e.what());
    return 2;
  } catch (const std::exception& e) {
    log::info(std::string("error: ") + e.what());
    return 1;
  }
}
