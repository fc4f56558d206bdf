// The Control service of proto/dlrun/v1/control.proto over the keys a job's agents keep in its
// rendezvous store (control/state/control_state.h, rendezvous/elastic_protocol.h). ARCHITECTURE.md
// section 10. Every call opens its own store connection: gRPC's synchronous server runs the
// handlers on its own threads, and a store connection serves one request at a time. Handlers
// never throw; each failure is a status with a one-line message.
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "control/log_relay.h"
#include "dlrun/v1/control.grpc.pb.h"
#include "store/leasing_store.h"

namespace dlrun::control {

// How WatchEvents follows a job.
struct WatchTiming {
  // How long a follower's store wait lasts before it looks at its call and at the job again.
  std::chrono::milliseconds poll{500};
  // How long an event that ctl/seq counts but nobody wrote is waited for (its publisher died
  // between the ADD and the SET) before the watcher gets a "gap" event in its place.
  std::chrono::milliseconds gapWait{3'000};
  // After the job's end, how long a follower waits for more events (agents report their
  // workers' exits as they stop) before the stream ends; each event starts the wait again.
  std::chrono::milliseconds endQuiet{2'000};
};

struct ControlServiceOptions {
  // Opens a connection to the store that holds the jobs' keys; throws NetworkError when none
  // can be opened.
  std::function<std::unique_ptr<LeasingStore>()> connect;
  WatchTiming watch;
  LogTiming logs;
  // Every call comes from this very process (`dlrun stop` under etcd), which reaches the store
  // itself anyway: a job without a token takes its stops and signals as from this host.
  bool inProcess = false;
};

class ControlService final : public v1::Control::Service {
 public:
  explicit ControlService(ControlServiceOptions options) : options_(std::move(options)) {}

  grpc::Status GetJob(grpc::ServerContext* context, const v1::JobRef* request,
                      v1::Job* response) override;
  grpc::Status ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status WatchEvents(grpc::ServerContext* context, const v1::WatchEventsRequest* request,
                           grpc::ServerWriter<v1::Event>* writer) override;
  grpc::Status StopJob(grpc::ServerContext* context, const v1::StopJobRequest* request,
                       v1::Ack* response) override;
  grpc::Status SignalJob(grpc::ServerContext* context, const v1::SignalJobRequest* request,
                         v1::Ack* response) override;
  grpc::Status GetLogs(grpc::ServerContext* context, const v1::LogsRequest* request,
                       grpc::ServerWriter<v1::LogLine>* writer) override;

 private:
  const ControlServiceOptions options_;
};

}  // namespace dlrun::control
