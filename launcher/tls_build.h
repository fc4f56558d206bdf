// dlrun's gRPC has no TLS, so that no agent loads OpenSSL at its start (proto/CMakeLists.txt
// says what that costs); dlrun-tls is the same program built with it. A command that dials etcd
// over TLS runs dlrun-tls in dlrun's stead: the same arguments and environment, in the same
// process (exec), so the process a user, Slurm or a test started stays the one that runs the job.
#pragma once

namespace dlrun::launcher {

inline constexpr const char* kTlsBuildName = "dlrun-tls";

// Returns where `tls` is false or this program has TLS; else execs dlrun-tls (beside this
// program in a build tree, in the package's libexec directory once installed) with `argv`, or
// throws Error when it is not there or does not start.
void runTlsBuildIfNeeded(bool tls, char** argv);

}  // namespace dlrun::launcher
