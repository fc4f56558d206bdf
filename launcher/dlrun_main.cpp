// dlrun: the launcher and per-node agent. Parses torchrun's flags and runs the workers; or, as
// `dlrun status|events|stop`, asks a running job's control plane.
#include "common/cli.h"
#include "common/log.h"
#include "launcher/control_cli.h"
#include "launcher/host_probe.h"
#include "launcher/launch.h"
#include "launcher/launch_cli.h"
#include "launcher/tls_build.h"

int main(int argc, char** argv) {
  using namespace dlrun;
  log::setProgramName("dlrun");
  return guardedMain([&] {
    const std::vector<std::string> args(argv + 1, argv + argc);
    if (launcher::isControlCommand(args)) {
      auto control = launcher::parseControlArgs(args, launcher::HostProbe::real().env);
      if (control.exitCode) return *control.exitCode;
      launcher::runTlsBuildIfNeeded(
          control.request.etcd && control.request.etcd->client.security.tls, argv);
      return launcher::runControl(control.request);
    }
    auto parsed = launcher::parseDlrunArgs(args, launcher::HostProbe::real());
    if (parsed.exitCode) return *parsed.exitCode;
    launcher::runTlsBuildIfNeeded(
        parsed.config.rdzvBackend == launcher::RdzvBackend::Etcd && parsed.config.etcdSecurity.tls,
        argv);
    return launcher::launch(parsed.config);
  });
}
