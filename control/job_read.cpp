#include "control/job_read.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <chrono>

#include "common/error.h"
#include "rendezvous/elastic_protocol.h"

namespace dlrun::control {

namespace {

namespace elastic = rendezvous::elastic;

// The records of an agent whose progress this version cannot read are left out: the rest of
// the job still shows.
template <typename Decode>
auto decodedOr(const std::string& text, Decode decode) -> std::optional<decltype(decode(text))> {
  if (text.empty()) return std::nullopt;
  try {
    return decode(text);
  } catch (const ProtocolError&) {
    return std::nullopt;
  }
}

// A worker's pace from its agent's record, where the record is of the worker's round.
void fillProgress(const RankProgress& r, const NodeProgress& record, double now, v1::Worker& out) {
  const double written = record.time;
  out.set_reported(true);
  out.set_step(r.step);
  out.set_progress_time(written - r.sinceStep);
  out.set_steps_per_second(r.stepsPerSecond);
  out.set_since_step(secondsSinceStep(r, record, now));
  out.set_has_loss(r.loss.has_value());
  out.set_has_accuracy(r.accuracy.has_value());
  if (r.loss) out.set_loss(*r.loss);
  if (r.accuracy) out.set_accuracy(*r.accuracy);
  out.set_samples(r.samples);
  out.set_epoch(r.epoch);
  for (const auto& [name, value] : r.metrics) (*out.mutable_metrics())[name] = value;
}

v1::Node toProto(const AgentRecord& agent, int64_t replacedBy, const NodeProgress* progress,
                 const std::vector<Straggler>& stragglers, double now) {
  v1::Node out;
  out.set_name(agent.name);
  out.set_agent(static_cast<int32_t>(agent.id));
  out.set_replaced_by(static_cast<int32_t>(replacedBy));
  if (!agent.state) return out;  // listed before its first record landed
  const NodeState& n = *agent.state;
  out.set_address(n.address);
  out.set_group_rank(n.groupRank);
  out.set_state(n.state);
  out.set_round(n.round);
  out.set_log_dir(n.logDir);
  out.set_updated(n.updated);
  if (n.sittingOut) {
    out.set_sitting_out(n.sittingOut->reason);
    out.set_sitting_out_cause(n.sittingOut->cause);
  }
  for (const auto& w : n.workers) {
    v1::Worker* worker = out.add_workers();
    worker->set_rank(w.rank);
    worker->set_local_rank(w.localRank);
    worker->set_pid(w.pid);
    worker->set_state(w.state);
    worker->set_exit(w.exit);
    worker->set_step(w.step);
    worker->set_progress_time(w.progressTime);
    if (progress && progress->round == n.round)
      for (const auto& r : progress->ranks)
        if (r.rank == w.rank) fillProgress(r, *progress, now, *worker);
    for (const auto& s : stragglers)
      if (s.rank == w.rank && n.state == "running") worker->set_straggler(true);
  }
  return out;
}

}  // namespace

[[noreturn]] void refuse(grpc::StatusCode code, const std::string& message) {
  throw Refusal{grpc::Status(code, message)};
}

std::string protoJson(const google::protobuf::Message& message) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

v1::Event toProto(const JobEvent& e) {
  v1::Event out;
  out.set_seq(e.seq);
  out.set_time(e.time);
  out.set_kind(e.kind);
  out.set_node(e.node);
  out.set_round(e.round);
  out.set_rank(e.rank);
  out.set_detail(e.detail);
  out.set_agent(e.agent);
  return out;
}

JobRecord readJob(LeasingStore& store, const std::string& id, JobParts parts) {
  const bool withNodes = parts == JobParts::WithNodes;
  if (id.empty()) refuse(grpc::StatusCode::INVALID_ARGUMENT, "no job id given");
  const Keys c(id);
  const elastic::Keys r(id);
  const auto first = store.peek(
      {c.meta(), c.nodes(), r.stop(), r.current(), r.forgotten(), r.shape(), c.summary()});
  if (first[0].empty() && first[3].empty())
    refuse(grpc::StatusCode::NOT_FOUND, "no job '" + id + "' on this server");
  JobRecord job{.id = id,
                .keys = {.stop = first[2], .current = first[3], .forgotten = first[4]},
                .summary = first[6]};
  if (!first[0].empty()) {
    job.meta = decodeMeta(first[0]);
  } else if (const std::string& shape = first[5]; !shape.empty()) {
    // Agents that publish no settings still wrote the rendezvous's shape.
    const elastic::Shape decoded = elastic::decodeShape(shape);
    job.meta.minNodes = decoded.minNodes;
    job.meta.maxNodes = decoded.maxNodes;
  }

  std::vector<std::string> keys;
  const int round = static_cast<int>(storedCount(first[3], r.current()));
  if (!first[3].empty()) {
    keys = {r.closed(round), r.end(round), r.members(round)};
    if (round > 0) keys.insert(keys.end(), {r.closed(round - 1), r.end(round - 1)});
  }
  const size_t roundKeys = keys.size();
  // A single node's state is its agent's record (localJobStatus).
  const bool withStates = withNodes || job.meta.backend == kLocalBackend;
  // Its name, and its state and progress.
  const size_t perAgent = withNodes ? 3 : withStates ? 2 : 1;
  const int64_t registered = storedCount(first[1], c.nodes());
  for (int64_t i = 1; i <= registered; ++i) {
    keys.push_back(c.nodeAt(i));
    if (withStates) keys.push_back(c.node(i));
    if (withNodes) keys.push_back(c.progress(i));
  }
  if (withNodes) keys.push_back(c.stragglers());
  if (keys.empty()) return job;
  auto values = store.peek(keys);
  if (withNodes)
    job.stragglers = decodedOr(values.back(), decodeStragglers).value_or(std::vector<Straggler>{});
  std::string members;
  std::string* into[] = {&job.keys.closed, &job.keys.end, &members, &job.keys.previousClosed,
                         &job.keys.previousEnd};
  for (size_t i = 0; i < roundKeys; ++i) *into[i] = std::move(values[i]);
  // The first member's assignment: the restarts used before the round (the same in each).
  if (const auto ids = elastic::decodeMembers(members); !ids.empty())
    job.keys.assignment = store.peek({r.assignment(round, ids.front())})[0];
  // Every registration is an agent of its own, those of one host too; one not named yet (between
  // its count and its first state) is not listed.
  for (int64_t i = 1; i <= registered; ++i) {
    const size_t at = roundKeys + static_cast<size_t>(i - 1) * perAgent;
    if (values[at].empty()) continue;
    AgentRecord agent{.id = i, .name = values[at]};
    if (withStates && !values[at + 1].empty()) agent.state = decodeNodeState(values[at + 1]);
    if (withNodes)
      if (auto progress = decodedOr(values[at + 2], decodeNodeProgress))
        job.progress[i] = std::move(*progress);
    job.agents.push_back(std::move(agent));
  }
  return job;
}

JobStatus statusOf(const JobRecord& job) {
  if (job.meta.backend != kLocalBackend) return jobStatus(job.keys);
  std::optional<int> nodeRound;
  if (!job.agents.empty() && job.agents[0].state) nodeRound = job.agents[0].state->round;
  JobStatus status = localJobStatus(job.keys, nodeRound);
  // A single node's rounds are not in the store: its failure summary says that it failed.
  if (!status.end && !job.summary.empty()) {
    status.state = v1::FAILED;
    status.end = rendezvous::RoundEnd{
        .kind = rendezvous::RoundEnd::Kind::WorkerFailed, .final = true, .report = job.summary};
  }
  return status;
}

void fillJob(const JobRecord& job, double now, v1::Job& out) {
  const JobStatus status = statusOf(job);
  out.set_id(job.id);
  out.set_backend(job.meta.backend);
  out.set_state(status.state);
  out.set_round(status.round);
  out.set_min_nodes(job.meta.minNodes);
  out.set_max_nodes(job.meta.maxNodes);
  out.set_restarts_used(status.restartsUsed);
  out.set_max_restarts(job.meta.maxRestarts);
  out.set_time(now);
  const std::vector<int64_t> replaced = replacedBy(job.agents);
  for (size_t i = 0; i < job.agents.size(); ++i) {
    auto progress = job.progress.find(job.agents[i].id);
    *out.add_nodes() =
        toProto(job.agents[i], replaced[i],
                progress == job.progress.end() ? nullptr : &progress->second, job.stragglers, now);
  }
  // The nodes' failures, the first in time first, once group rank 0 wrote them; the round's
  // report until then.
  if (status.state == v1::FAILED)
    out.set_root_cause(job.summary.empty() ? status.end->report : job.summary);
  // A job that ended has no stragglers left: the list is the last round's.
  if (status.end) return;
  for (const auto& s : job.stragglers) {
    v1::Straggler* straggler = out.add_stragglers();
    straggler->set_rank(s.rank);
    straggler->set_node(s.node);
    straggler->set_steps_per_second(s.stepsPerSecond);
    straggler->set_median(s.median);
    straggler->set_seconds(std::max(0.0, now - s.below));
    straggler->set_detail(describe(s, now));
  }
}

}  // namespace dlrun::control
