// `dlrun status`, `dlrun events`, `dlrun stop`, `dlrun top` and `dlrun logs`: the control plane's
// command line
// (ARCHITECTURE.md section 10). They talk gRPC (proto/dlrun/v1/control.proto) to whatever serves
// the job's rendezvous store, on the store's own port: --rdzv-endpoint and --rdzv-id as for the
// launch, or, inside a Slurm allocation, the endpoint and id the launcher derives there. Under
// --rdzv-backend=etcd they run the Control service in process over the job's keys in etcd.
// Human tables by default, --json for scripts. A bad flag, an unreachable endpoint, something
// that is not a dlrun control plane or an unknown job is one line and exit 2.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/host_port.h"
#include "rendezvous/etcd/etcd_store.h"

#include "dlrun/v1/control.pb.h"

namespace dlrun::launcher {

// Whether dlrun's first argument names a control command rather than an entry point.
bool isControlCommand(const std::vector<std::string>& args);

struct ControlRequest {
  std::string command;  // status, events, stop, top, logs
  HostPort store;       // the job's store, whose port serves the control plane
  // --rdzv-backend=etcd: the job's keys in etcd (`store` stays unset)
  std::optional<rendezvous::etcd::EtcdStoreOptions> etcd;
  std::string jobId;
  bool json = false;
  bool follow = false;        // events: keep following until the job ends
  int64_t since = 0;          // events: after this sequence number
  std::optional<int> signal;  // stop --signal: send it instead of stopping
  int exitCode = 0;           // stop: what every agent exits with (0: 143, as after SIGTERM)
  std::string reason;
  std::string token;                          // --token-file's content or DLRUN_TOKEN
  std::chrono::milliseconds timeout{5'000};   // each call's deadline (not a followed stream's)
  std::chrono::milliseconds interval{1'000};  // top: between frames
  bool once = false;                          // top: one frame, no screen control
  dlrun::v1::LogsRequest logs;                // logs: what is asked (its job set on the call)
};

struct ControlParse {
  ControlRequest request;
  std::optional<int> exitCode;  // --help
};

// Pure but for reading --token-file. `env`: the process's environment (DLRUN_TOKEN, SLURM_*).
// Throws ConfigError naming the flag.
ControlParse parseControlArgs(const std::vector<std::string>& args,
                              const std::map<std::string, std::string>& env);

// Runs the request and prints its answer on stdout; returns the exit code. Throws ConfigError
// (exit 2) when the endpoint cannot be reached, is not a dlrun control plane, or does not know
// the job, and when the call is refused.
int runControl(const ControlRequest& request);

// A job's state and a unix time of day (UTC, HH:MM:SS) as the human forms say them.
const char* stateName(dlrun::v1::JobState state);
std::string clockTime(double unixSeconds);

// The human forms (pure, for tests).
std::string formatJob(const dlrun::v1::Job& job);
std::string formatEvent(const dlrun::v1::Event& event);
// A line of `dlrun logs`: as the worker wrote it for one rank's output; "[R]: " before it where
// several ranks' lines mix; "[RANKS] NODES: " in the job-wide view (grouped), with a count where
// the ranks printed it more than once each. With its newline.
std::string formatLogLine(const dlrun::v1::LogLine& line, bool prefixed, bool grouped);

}  // namespace dlrun::launcher
