#include "agents/agent_metrics.h"

#include <unistd.h>

#include <chrono>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/host_port.h"
#include "common/log.h"
#include "metrics/routes.h"
#include "metrics/store_metrics.h"

namespace dlrun::agents {

using nlohmann::json;
using Kind = rendezvous::RoundEnd::Kind;

namespace {

const char* const kCauses[] = {"failure",  "hang",      "node_lost",
                               "scale_up", "node_left", "store_lost"};

// A single-node job's agent has no name of its own: the host's, then.
std::string nameOrHost(std::string name) {
  if (!name.empty()) return name;
  char host[256] = {};
  return ::gethostname(host, sizeof(host) - 1) == 0 ? host : "this node";
}

json optionalJson(const std::optional<double>& value) {
  return value ? json(*value) : json(nullptr);
}

}  // namespace

std::string restartCause(const rendezvous::RoundEnd& end) {
  switch (end.kind) {
    case Kind::WorkerFailed: return end.hang ? "hang" : "failure";
    case Kind::NodeLost: return "node_lost";
    case Kind::NodeJoined: return "scale_up";
    case Kind::NodeLeft: return "node_left";
    case Kind::StoreLost: return "store_lost";
    case Kind::Finished:
    case Kind::Stopped: break;
  }
  return "none";
}

AgentView::AgentView(std::string nodeName)
    : nodeName_(std::move(nodeName)),
      recovery_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}) {
  for (const char* cause : kCauses) restarts_[cause] = 0;  // a series from the start: rate() works
}

void AgentView::roundStarted(const rendezvous::World& world, int workers, Clock::time_point now) {
  world_ = world;
  inRound_ = true;
  ++rounds_;
  up_ = workers;
  if (nodeLostAt_) {
    recovery_.observe(std::chrono::duration<double>(now - *nodeLostAt_).count());
    nodeLostAt_.reset();
  }
}

void AgentView::roundEnded(const rendezvous::RoundEnd& end, Clock::time_point now) {
  if (end.kind == Kind::NodeLost && !nodeLostAt_) nodeLostAt_ = now;
}

void AgentView::restarting(const rendezvous::RoundEnd& end) {
  ++restarts_[restartCause(end)];
  inRound_ = false;
}

void AgentView::workerExited(int shellCode) {
  ++exits_[shellCode];
  if (up_ > 0) --up_;
}

void AgentView::event(control::JobEvent event) {
  events_.push_back(std::move(event));
  if (events_.size() > kMaxEvents) events_.pop_front();
}

void AgentView::progress(const std::vector<ProgressReading>& workers, double wallNow) {
  if (workers.empty() || workers[0].beats == 0) return;
  int64_t samples = 0;
  for (const auto& w : workers) samples += w.samples;
  // A new round's board (or restarted workers) starts the sum again from zero.
  if (lastSamples_ >= 0 && samples >= lastSamples_) {
    samplesTotal_ += static_cast<uint64_t>(samples - lastSamples_);
    const double dt = wallNow - lastSampleTime_;
    if (dt > 0 && samples > lastSamples_) samplesPerSecond_ = (samples - lastSamples_) / dt;
  }
  const ProgressReading& first = workers[0];
  const bool newStep = !last_ || last_->step != first.step || last_->epoch != first.epoch ||
                       last_->results != first.results || last_->accuracy != first.accuracy;
  if (samples != lastSamples_ || newStep) {
    lastSamples_ = samples;
    lastSampleTime_ = wallNow;
  }
  last_ = first;
  if (!newStep) return;
  curve_.push_back(
      {.time = wallNow,
       .step = first.step,
       .epoch = first.epoch,
       .loss = first.results & kReportedLoss ? std::optional(first.loss) : std::nullopt,
       .accuracy = first.results & kReportedAccuracy ? std::optional(first.accuracy) : std::nullopt,
       .samplesPerSecond = samplesPerSecond_});
  if (curve_.size() > kMaxCurve) {
    // Keep every other point, and always the newest.
    std::vector<CurvePoint> kept;
    kept.reserve(kMaxCurve / 2 + 1);
    for (size_t i = 0; i < curve_.size(); i += 2) kept.push_back(curve_[i]);
    if (curve_.size() % 2 == 0) kept.push_back(curve_.back());
    curve_ = std::move(kept);
  }
}

std::string AgentView::metricsText(const std::optional<StoreStats>& store) const {
  metrics::Exposition out;
  out.family("dlrun_agent_info", "gauge", "This node's agent: its node name and the job's id");
  out.sample("dlrun_agent_info", {{"node", nodeName_}, {"run_id", world_.runId}}, 1);
  out.family("dlrun_rendezvous_rounds_total", "counter", "Rounds this node took part in");
  out.sample("dlrun_rendezvous_rounds_total", static_cast<double>(rounds_));
  out.family("dlrun_rendezvous_round", "gauge", "The current round's number");
  out.sample("dlrun_rendezvous_round", world_.round);
  out.family("dlrun_rendezvous_nodes", "gauge", "Nodes in the current round");
  out.sample("dlrun_rendezvous_nodes", inRound_ ? world_.groupWorldSize : 0);
  out.family("dlrun_rendezvous_workers", "gauge", "Workers in the current round, every node's");
  out.sample("dlrun_rendezvous_workers", inRound_ ? world_.worldSize : 0);
  out.family("dlrun_rendezvous_restarts_total", "counter",
             "New rounds this node began after one ended, by cause");
  for (const auto& [cause, n] : restarts_)
    out.sample("dlrun_rendezvous_restarts_total", {{"cause", cause}}, static_cast<double>(n));
  out.histogram("dlrun_rendezvous_node_loss_recovery_seconds",
                "Seconds from learning of a lost node to this node's new workers", recovery_);
  out.family("dlrun_workers_up", "gauge", "This node's workers running");
  out.sample("dlrun_workers_up", static_cast<double>(up_));
  out.family("dlrun_worker_exits_total", "counter",
             "This node's worker exits, by exit code (128 + N: signal N)");
  for (const auto& [code, n] : exits_)
    out.sample("dlrun_worker_exits_total", {{"code", std::to_string(code)}},
               static_cast<double>(n));
  // A series per cause from the start, as the restarts': a node's sitting out is one of them at 1.
  out.family("dlrun_node_sitting_out", "gauge",
             "1 while this node sits the rounds out, by cause: health_check (its checks failed), "
             "quarantine (its workers failed too often)");
  const std::string outFor = node_ && node_->sittingOut ? node_->sittingOut->cause : "";
  for (const char* cause : {control::kHealthCheck, control::kQuarantine})
    out.sample("dlrun_node_sitting_out", {{"cause", cause}}, outFor == cause ? 1 : 0);
  out.family("dlrun_stragglers", "gauge",
             "Ranks this node's watch names slow now (group rank 0's agent watches the job)");
  out.sample("dlrun_stragglers", static_cast<double>(stragglers_.size()));
  if (!stragglers_.empty()) {
    out.family("dlrun_straggler_pace_ratio", "gauge",
               "A slow rank's steps per second over the median of the job's ranks");
    for (const auto& [rank, s] : stragglers_)
      out.sample("dlrun_straggler_pace_ratio", {{"rank", std::to_string(rank)}, {"node", s.node}},
                 s.median > 0 ? s.stepsPerSecond / s.median : 0);
  }
  if (last_) {
    out.family("dlrun_progress_step", "gauge", "The step local rank 0 reported last");
    out.sample("dlrun_progress_step", static_cast<double>(last_->step));
    out.family("dlrun_progress_epoch", "gauge", "The epoch local rank 0 reported last");
    out.sample("dlrun_progress_epoch", static_cast<double>(last_->epoch));
    out.family("dlrun_progress_samples_total", "counter",
               "Examples this node's workers reported trained on");
    out.sample("dlrun_progress_samples_total", static_cast<double>(samplesTotal_));
    out.family("dlrun_progress_samples_per_second", "gauge",
               "Examples per second this node's workers train on, at the last sample");
    out.sample("dlrun_progress_samples_per_second", samplesPerSecond_);
    if (last_->results & kReportedLoss) {
      out.family("dlrun_progress_loss", "gauge", "The training loss local rank 0 reported last");
      out.sample("dlrun_progress_loss", last_->loss);
    }
    if (last_->results & kReportedAccuracy) {
      out.family("dlrun_progress_test_accuracy_ratio", "gauge",
                 "The test accuracy local rank 0 reported last (0 to 1)");
      out.sample("dlrun_progress_test_accuracy_ratio", last_->accuracy);
    }
  }
  std::string text = out.text();
  if (store) {
    metrics::Exposition storeOut;
    metrics::addStoreMetrics(storeOut, *store);
    text += storeOut.text();
  }
  return text;
}

std::string AgentView::stateJson(const std::optional<StoreStats>& store, double wallNow) const {
  // The job's nodes as this round sees them: consecutive ranks on one host are one node.
  json nodes = json::array();
  for (size_t rank = 0; rank < world_.workerEndpoints.size(); ++rank) {
    const std::string& endpoint = world_.workerEndpoints[rank];
    const std::string host = endpoint.substr(0, endpoint.rfind(':'));
    if (nodes.empty() || nodes.back()["host"] != host)
      nodes.push_back({{"host", host}, {"first_rank", rank}, {"last_rank", rank}});
    else
      nodes.back()["last_rank"] = rank;
  }
  json workers = json::array();
  json thisNode = nullptr;
  if (node_) {
    for (const auto& w : node_->workers)
      workers.push_back({{"rank", w.rank},
                         {"local_rank", w.localRank},
                         {"pid", w.pid},
                         {"state", w.state},
                         {"exit", w.exit}});
    thisNode = {{"name", node_->name},
                {"address", node_->address},
                {"state", node_->state},
                {"round", node_->round},
                {"group_rank", node_->groupRank},
                {"workers", workers},
                {"sitting_out", node_->sittingOut ? json(node_->sittingOut->reason) : json()}};
  }
  json events = json::array();
  for (const auto& e : events_)
    events.push_back({{"time", e.time},
                      {"kind", e.kind},
                      {"node", e.node},
                      {"round", e.round},
                      {"rank", e.rank},
                      {"detail", e.detail}});
  json curve = json::array();
  for (const auto& p : curve_)
    curve.push_back({p.time, p.step, p.epoch, optionalJson(p.loss), optionalJson(p.accuracy),
                     p.samplesPerSecond});
  json exits = json::object();
  for (const auto& [code, n] : exits_) exits[std::to_string(code)] = n;
  json state = {{"kind", "agent"},
                {"time", wallNow},
                {"node", nodeName_},
                {"run_id", world_.runId},
                {"round", world_.round},
                {"rounds", rounds_},
                {"group_rank", world_.groupRank},
                {"nodes", inRound_ ? world_.groupWorldSize : 0},
                {"world_size", inRound_ ? world_.worldSize : 0},
                {"workers_up", up_},
                {"restarts", restarts_},
                {"exits", exits},
                {"job_nodes", nodes},
                {"this_node", thisNode},
                {"events", events},
                {"curve", curve}};
  if (store) state["store"] = json::parse(metrics::storeJson(*store));
  return state.dump();
}

AgentMetrics::AgentMetrics(boost::asio::io_context& io, MetricsOptions options,
                           std::string nodeName)
    : options_(std::move(options)),
      view_(nameOrHost(std::move(nodeName))),
      server_(io, {.host = options_.host, .port = options_.port},
              metrics::routes(
                  [this] {
                    return view_.metricsText(
                        options_.storeStats ? std::optional(options_.storeStats()) : std::nullopt);
                  },
                  [this] {
                    return view_.stateJson(
                        options_.storeStats ? std::optional(options_.storeStats()) : std::nullopt,
                        unixSeconds());
                  },
                  options_.jobApi)) {
  const std::string at = "http://" + joinHostPort(server_.address(), server_.port());
  log::info("metrics on " + at + "/metrics, this node's page on " + at + "/" +
            (options_.jobApi ? ", the whole job's on " + at + "/job" : std::string()));
}

AgentMetrics::~AgentMetrics() = default;

}  // namespace dlrun::agents
