// What this node's agent tells the control plane, and what the control plane asks of it
// (ARCHITECTURE.md section 10). The agent hands over its node's state and the job's events as
// they change; they are written to the job's rendezvous store (control/state/control_state.h),
// where the Control service reads them: one write a change, none a worker step. Signals and
// stops sent to the job (SignalJob, StopJob) come back as commands; requests for output
// (`dlrun logs`) go to the node's LogServer.
//
// Nothing is sent before the first node() or event() (the agent's first workers started, or it
// sits a round out): an observer stays off the agents' way into a round, where every agent of a
// job meets the store at once. The first write registers this agent (its index in the job is its
// id, under which its state is kept: agents that share a host stay apart) and reads where its
// commands begin; commands sent before then are not for it (it had no workers to signal), but a
// single-node job's stop is also its store's `stop` key, read then too.
//
// The ranks' pace (progress()) is written at most once a second, the newest replacing a queued
// one. Group rank 0's publisher also watches for stragglers (control/state/stragglers.h): every
// two seconds it reads every agent's pace in one request, names the ranks that stay slow as
// events, in ctl/stragglers, on stderr and to the agent (onStragglers).
//
// Threads: two of its own, because each blocks on the store while the agent's io_context must
// not: one writes what node(), event() and progress() queue (a newer node state replaces a
// queued one) and watches, one (started by the first) waits for the job's next command. Store
// failures are logged once and never reach the agent: the control plane is an observer, a job runs
// the same without it.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "agents/log_server.h"
#include "control/state/control_state.h"
#include "control/state/progress_record.h"
#include "control/state/stragglers.h"
#include "store/leasing_store.h"

namespace dlrun::agents {

struct ControlOptions {
  std::string runId;
  control::ControlMeta meta;
  std::string nodeName;
  std::string address;  // this node's numeric address
  // Opens a connection to the job's rendezvous store (two are open at a time).
  std::function<std::unique_ptr<LeasingStore>()> connect;
  // Said once the agent's set-up has passed (how to reach a job whose id and port are drawn at
  // random), so that bad input stays the one line it prints; empty: nothing.
  std::string announce;
  control::StragglerRule stragglers;  // --straggler-fraction, --straggler-window
};

using control::ControlCommand;

namespace detail {
class PublisherImpl;
}

class ControlPublisher {
 public:
  // The ranks named slow now, by rank, each time that changes (group rank 0's alone).
  using StragglersSeen = std::function<void(const std::map<int, control::Straggler>&)>;

  // `onCommand` and `onStragglers` run on the publisher's own thread: post them to where they
  // belong.
  ControlPublisher(ControlOptions options, std::function<void(const ControlCommand&)> onCommand,
                   StragglersSeen onStragglers = {});
  ~ControlPublisher();  // writes what is queued (within a few seconds), then stops
  ControlPublisher(const ControlPublisher&) = delete;
  ControlPublisher& operator=(const ControlPublisher&) = delete;

  void node(control::NodeState state);
  void event(control::JobEvent event);
  void progress(control::NodeProgress progress);
  // A round of `nodes` started its workers; `leader`: this node is its group rank 0, which
  // watches for stragglers. The job's size sets how often the pace is written (recordPeriod).
  void round(int round, int nodes, bool leader);
  // Waits until every event queued so far is in the store, or `limit` passed: before a report
  // whose consequences other nodes publish (a failure, then group rank 0's restart), so the
  // job's events show the cause first.
  void flush(std::chrono::milliseconds limit);
  // Where an attempt's output files are, for `dlrun logs` (log_server.h).
  void attemptFiles(AttemptFiles files);

 private:
  std::unique_ptr<detail::PublisherImpl> impl_;  // its state and threads (control_publisher.cpp)
};

}  // namespace dlrun::agents
