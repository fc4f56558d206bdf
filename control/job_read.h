// Reading one job from its store keys into the Control service's messages (ARCHITECTURE.md
// section 10): what GetJob answers, and what the job's page and `dlrun top` show. Up to three
// round trips: the settings, the agent count, the rendezvous's keys; then the rounds, every
// agent's name, state and progress record, the stragglers; then the restarts used.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "control/job_state.h"
#include "control/state/control_state.h"
#include "control/state/progress_record.h"
#include "control/state/stragglers.h"
#include "dlrun/v1/control.pb.h"
#include "store/leasing_store.h"

namespace dlrun::control {

// A call refused with a status (an unknown job, a bad argument); the service turns it into the
// call's status, the page into an HTTP error.
struct Refusal {
  grpc::Status status;
};

[[noreturn]] void refuse(grpc::StatusCode code, const std::string& message);

// How much of a job readJob reads.
enum class JobParts {
  // The settings, the rounds' keys, the summary and every agent's name (a single node's agent's
  // state too): enough for the job's status and who may call on it (statusOf, authorize).
  Status,
  // Besides, every agent's state and progress record and the stragglers: the job's whole view.
  WithNodes,
};

struct JobRecord {
  std::string id;
  ControlMeta meta;                 // none published: defaults, with the node range from `shape`
  std::vector<AgentRecord> agents;  // in registration order; states read WithNodes
  RoundKeys keys;
  std::map<int64_t, NodeProgress> progress;  // by agent, read WithNodes
  std::vector<Straggler> stragglers;         // read WithNodes
  std::string summary;  // ctl/summary: the failed job's failure summary, once written
};

// Throws Refusal NOT_FOUND for a job the store holds nothing of, INVALID_ARGUMENT for no id.
JobRecord readJob(LeasingStore& store, const std::string& id, JobParts parts);
JobStatus statusOf(const JobRecord& job);

v1::Event toProto(const JobEvent& event);
// A message as JSON with the proto's field names and every field (`--json`, the job's page).
std::string protoJson(const google::protobuf::Message& message);
// GetJob's answer (at `now`, unix seconds) from a job read with its nodes.
void fillJob(const JobRecord& job, double now, v1::Job& out);

}  // namespace dlrun::control
