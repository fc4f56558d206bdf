#include "launcher/tls_build.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/error.h"
#include "common/program_files.h"
#include "grpc_runtime.h"

namespace dlrun::launcher {

void runTlsBuildIfNeeded(bool tls, char** argv) {
  if (!tls || proto::hasTls()) return;
  const std::string path = findProgramFile(kTlsBuildName, DLRUN_TLS_BUILD_DIR);
  if (path.empty())
    throw Error(std::string("etcd over TLS needs ") + kTlsBuildName +
                " (dlrun built with TLS), which is neither beside this program nor in " +
                DLRUN_TLS_BUILD_DIR + " from it: reinstall dlrun");
  ::execv(path.c_str(), argv);
  throw Error("cannot run " + path + ": " + std::strerror(errno));
}

}  // namespace dlrun::launcher
