// GetLogs (docs/design/control.md, "Logs"): asks a job's agents for output through its store
// (control/state/log_mailbox.h) and passes their answers on to the caller, as the rest of the
// Control service does, holding nothing of its own: the request and the answers are store keys,
// each answer's chunk deleted once sent on.
#pragma once

#include <chrono>

#include <grpcpp/grpcpp.h>

#include "control/job_read.h"
#include "control/state/log_mailbox.h"
#include "dlrun/v1/control.pb.h"
#include "store/leasing_store.h"

namespace dlrun::control {

struct LogTiming {
  // How long an agent may take to say whether it holds what was asked.
  std::chrono::milliseconds answer{5'000};
  // A followed agent that sent nothing for this long (it sends an empty chunk every 5 s) is
  // taken for gone.
  std::chrono::milliseconds silence{15'000};
  // How long one wait on the store lasts before the call's cancellation is looked at.
  std::chrono::milliseconds poll{200};
};

// The request as the agents read it; INVALID_ARGUMENT (a Refusal) for one that asks nothing
// sensible.
LogRequest toLogRequest(const v1::LogsRequest& request);

// Answers `request` for `job` (read with its nodes) on `writer`.
grpc::Status relayLogs(LeasingStore& store, const JobRecord& job, const LogRequest& request,
                       const LogTiming& timing, grpc::ServerContext& context,
                       grpc::ServerWriter<v1::LogLine>& writer);

}  // namespace dlrun::control
