// --metrics-port on an agent: Prometheus metrics and the live page for this node, served on the
// agent's own io_context (metrics/http_server.h). The agent tells AgentView what changes (a
// round, a restart, a worker's exit, its node state and events: the same moments it publishes
// to the control plane, O(1) each), and each look the agent's sampler takes at the progress
// board twice a second (progress_sampler.h), for the training curve.
//
// AgentView is pure (time comes from the caller), so its counts and texts are unit-tested;
// AgentMetrics adds the server.
#pragma once

#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "agents/worker_env.h"
#include "common/asio.h"
#include "common/clock.h"
#include "common/progress_board.h"
#include "control/state/control_state.h"
#include "control/state/stragglers.h"
#include "metrics/exposition.h"
#include "metrics/http_server.h"
#include "metrics/routes.h"
#include "rendezvous/round_end.h"
#include "rendezvous/world.h"
#include "store/store_server.h"

namespace dlrun::agents {

struct MetricsOptions {
  std::string host;   // empty until the launcher names the address this node uses for the job
  uint16_t port = 0;  // 0: a free one, printed
  // The store this process serves, if any: its counts join this agent's metrics.
  std::function<StoreStats()> storeStats;
  // The whole job's page (/job, /api/job), where the launcher can read the job's store.
  metrics::JobApi jobApi;
};

// One point of the training curve: a sample that saw a new step.
struct CurvePoint {
  double time = 0;  // unix seconds
  int64_t step = 0;
  int64_t epoch = 0;
  std::optional<double> loss;
  std::optional<double> accuracy;
  double samplesPerSecond = 0;  // this node's workers together
};

// Why a new round began, as the restart counter's label: failure, hang, node_lost, scale_up,
// node_left, store_lost.
std::string restartCause(const rendezvous::RoundEnd& end);

class AgentView {
 public:
  static constexpr size_t kMaxCurve = 1000;  // then every other point goes: the whole run, coarser
  static constexpr size_t kMaxEvents = 100;

  explicit AgentView(std::string nodeName);

  void roundStarted(const rendezvous::World& world, int workers, Clock::time_point now);
  void roundEnded(const rendezvous::RoundEnd& end, Clock::time_point now);
  void restarting(const rendezvous::RoundEnd& end);  // a new round follows this end
  void workerExited(int shellCode);
  void node(control::NodeState state) { node_ = std::move(state); }
  // The ranks group rank 0's watch names slow now (on group rank 0's agent; none elsewhere).
  void stragglers(std::map<int, control::Straggler> named) { stragglers_ = std::move(named); }
  void event(control::JobEvent event);
  // One look at the board: this node's workers by local rank.
  void progress(const std::vector<ProgressReading>& workers, double wallNow);

  std::string metricsText(const std::optional<StoreStats>& store) const;
  std::string stateJson(const std::optional<StoreStats>& store, double wallNow) const;
  const std::vector<CurvePoint>& curve() const { return curve_; }

 private:
  std::string nodeName_;
  rendezvous::World world_;
  bool inRound_ = false;
  uint64_t rounds_ = 0;
  std::map<std::string, uint64_t> restarts_;
  std::optional<Clock::time_point> nodeLostAt_;
  metrics::Histogram recovery_;
  int64_t up_ = 0;
  std::map<int, uint64_t> exits_;
  std::optional<control::NodeState> node_;
  std::map<int, control::Straggler> stragglers_;
  std::deque<control::JobEvent> events_;
  std::vector<CurvePoint> curve_;
  std::optional<ProgressReading> last_;  // local rank 0's newest reading
  int64_t lastSamples_ = -1;             // the workers' sum at the last sample
  double lastSampleTime_ = 0;
  uint64_t samplesTotal_ = 0;  // monotonic across rounds
  double samplesPerSecond_ = 0;
};

class AgentMetrics {
 public:
  // Binds at once and prints the address; throws ConfigError when the port cannot be had.
  AgentMetrics(boost::asio::io_context& io, MetricsOptions options, std::string nodeName);
  ~AgentMetrics();

  AgentView& view() { return view_; }

 private:
  const MetricsOptions options_;
  AgentView view_;
  metrics::HttpServer server_;
};

}  // namespace dlrun::agents
