// The dlrun command line: torchrun's flags (dashes or underscores, PET_<NAME> environment
// defaults, the flag winning) into one LaunchConfig. The small parsers are exposed so tests
// reach each rule directly; every error is a ConfigError naming the flag.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "launcher/host_probe.h"
#include "launcher/launch_config.h"

namespace dlrun::launcher {

struct LaunchParse {
  LaunchConfig config;
  std::optional<int> exitCode;  // set for --help/--version
};

LaunchParse parseDlrunArgs(const std::vector<std::string>& args, const HostProbe& host);

// --rdzv-backend as given. Where it is not given the other flags pick the backend
// (parseDlrunArgs holds every rule).
struct RdzvBackendFlag {
  RdzvBackend backend;
  bool slurm = false;  // "slurm": c10d set up from the Slurm allocation, which must exist
};
// "static", "c10d", "slurm", or "etcd" (also "etcd-v3"); "etcd-v2" is refused: dlrun speaks
// etcd's v3 API only.
RdzvBackendFlag parseRdzvBackend(const std::string& value);
// "N" or "MIN:MAX".
std::pair<int, int> parseNnodes(const std::string& value);
// "N", "cpu", "gpu" or "auto".
int parseNprocPerNode(const std::string& value, const HostProbe& host);
// "3" or "0:1,1:2".
agents::StreamsByRank parseStreams(const std::string& flag, const std::string& value);
// "k=v,k2=v2": the first step of --rdzv-conf, whose pairs parseRdzvSettings reads.
std::map<std::string, std::string> parseRdzvConf(const std::string& value);

// --stop-timeout's default in a Kubernetes pod (KUBERNETES_SERVICE_HOST set): under the 30 s a
// deleted pod gets before SIGKILL, so the whole node's job stops within that grace.
inline constexpr double kPodStopTimeoutSeconds = 25;
// The rendezvous settings in --rdzv-conf; unknown keys are refused.
RdzvSettings parseRdzvSettings(const std::map<std::string, std::string>& conf);
// The etcd client's security from the settings' cacert, cert, key, user, password and
// password_file (files read here) and the endpoints' scheme (https:// turns TLS on). Throws
// ConfigError naming the key: an unreadable or empty file, cert without key or the reverse, a
// password without a user or the reverse, password and password_file together.
rendezvous::etcd::EtcdSecurity etcdSecurity(
    const RdzvSettings& settings, const std::vector<rendezvous::etcd::Endpoint>& endpoints);
// A job's token (--token-file): the file's text less trailing newlines. Throws ConfigError
// naming `flag` for a file that cannot be read or is empty.
std::string readTokenFile(const std::string& flag, const std::string& path);
// --rdzv-endpoint of c10d: "HOST", "HOST:PORT" or "[V6]:PORT" (common/host_port.h), with
// kDefaultRdzvPort where it names no port.
HostPort parseRdzvEndpoint(const std::string& value);
// "0,2,3".
std::set<int> parseRanksFilter(const std::string& value);
// --hang-action: "report", "restart" or "exit".
agents::HangAction parseHangAction(const std::string& value);
// "auto", "always" or "never".
agents::TfConfigMode parseTfConfig(const std::string& value);
// --signals-to-handle: "SIGTERM,SIGUSR1" (names as parseSignal reads them, or numbers), in
// that order without repeats. Refused: an empty list or item, a name of no signal, SIGKILL and
// SIGSTOP (no process can handle them), SIGCHLD (dlrun's own: a worker ended) and the signals
// of a fault (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT).
std::vector<int> parseSignalsToHandle(const std::string& value);
// --duplicate-stdout-filters/--duplicate-stderr-filters, as torchrun reads them: cut at each
// ',', where ",," is a comma within a needle; "" is one empty needle, which every line holds.
std::vector<std::string> parseFilterList(const std::string& value);

}  // namespace dlrun::launcher
