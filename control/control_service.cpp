#include "control/control_service.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/error.h"
#include "common/signal_name.h"
#include "control/access.h"
#include "control/job_read.h"
#include "control/job_state.h"
#include "control/state/control_state.h"
#include "rendezvous/elastic_protocol.h"
#include "rendezvous/elastic_rendezvous.h"
#include "store/address.h"

namespace dlrun::control {

namespace {

namespace elastic = rendezvous::elastic;
using rendezvous::RoundEnd;

template <typename Fn>
grpc::Status guarded(Fn&& fn) {
  try {
    return fn();
  } catch (const Refusal& refusal) {
    return refusal.status;
  } catch (const TimeoutError& e) {
    return {grpc::StatusCode::DEADLINE_EXCEEDED, std::string("the job store: ") + e.what()};
  } catch (const NetworkError& e) {
    return {grpc::StatusCode::UNAVAILABLE, std::string("the job store: ") + e.what()};
  } catch (const std::exception& e) {
    return {grpc::StatusCode::INTERNAL, e.what()};
  }
}

std::string presentedToken(const grpc::ServerContext& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return {};
  return std::string(bearerToken(std::string_view(it->second.data(), it->second.size())));
}

bool fromThisHost(const std::string& address) {
  try {
    return !address.empty() && isLocalAddress(address);
  } catch (const Error&) {
    return false;
  }
}

void authorize(const grpc::ServerContext& context, const JobRecord& job, bool mutating,
               bool inProcess) {
  const std::string peer = peerAddress(context.peer());
  // Only a stop or a signal to a job without a token asks where the call comes from.
  const bool local = job.meta.tokenHash.empty() && mutating && (inProcess || fromThisHost(peer));
  switch (access(job.meta.tokenHash, presentedToken(context),
                 {.mutating = mutating, .fromThisHost = local})) {
    case Access::Granted: return;
    case Access::NoToken:
      refuse(
          grpc::StatusCode::UNAUTHENTICATED,
          "job '" + job.id + "' was started with a token: pass it (--token-file or DLRUN_TOKEN)");
    case Access::WrongToken:
      refuse(grpc::StatusCode::UNAUTHENTICATED, "the token given is not job '" + job.id + "''s");
    case Access::NotLocal:
      refuse(grpc::StatusCode::PERMISSION_DENIED,
             "job '" + job.id +
                 "' has no token, so it is stopped or signalled only from its "
                 "store's host (this call came from " +
                 (peer.empty() ? context.peer() : peer) +
                 "); start it with --token-file to allow other hosts");
  }
}

// Refuses a stop or a signal to a job that already ended: no agent is left to act on it, and a
// stop written now would turn a success into "stopped".
JobStatus requireRunning(const JobRecord& job) {
  JobStatus status = statusOf(job);
  if (status.end)
    refuse(grpc::StatusCode::FAILED_PRECONDITION,
           "job '" + job.id + "' already ended: " + status.end->describe());
  return status;
}

// Appends an event to the job's log the way agents do: ADD gives it its number, then SET.
void publish(LeasingStore& store, const Keys& keys, JobEvent event) {
  event.seq = store.add(keys.seq(), 1);
  event.time = unixSeconds();
  store.set(keys.event(event.seq), encode(event));
}

std::string clientName(const grpc::ServerContext& context) {
  const std::string peer = peerAddress(context.peer());
  return peer.empty() ? "a control client" : peer;
}

// Whether the job ended, as its agents see it (the stop, or an end of the newest round that
// ends the job): three keys in two round trips.
bool jobEnded(LeasingStore& store, const elastic::Keys& keys) {
  const auto found = store.peek({keys.stop(), keys.current()});
  if (!found[0].empty()) return true;
  if (found[1].empty()) return false;
  const int round = static_cast<int>(storedCount(found[1], keys.current()));
  return elastic::endedJob("", store.peek({keys.end(round)})[0]).has_value();
}

// One WatchEvents call: sends events in order from `since` + 1, each once.
class EventStream {
 public:
  EventStream(const WatchTiming& timing, LeasingStore& store, const std::string& id,
              grpc::ServerContext& context, grpc::ServerWriter<v1::Event>& writer)
      : timing_(timing),
        store_(store),
        keys_(id),
        rounds_(id),
        context_(context),
        writer_(writer) {}

  grpc::Status run(int64_t since, bool follow) {
    next_ = std::max<int64_t>(since, 0) + 1;
    std::optional<Clock::time_point> quietUntil;  // set once the job's end was seen
    for (;;) {
      if (context_.IsCancelled()) return grpc::Status::CANCELLED;
      // The end is read before the count, so every event published before it is sent.
      const bool ended = follow && !quietUntil && jobEnded(store_, rounds_);
      const int64_t published = storedCount(store_.peek({keys_.seq()})[0], keys_.seq());
      const bool sentAny = next_ <= published;
      if (!sendUpTo(published)) return grpc::Status::CANCELLED;
      if (!follow) return grpc::Status::OK;
      if (ended || (quietUntil && sentAny)) quietUntil = Clock::now() + timing_.endQuiet;
      if (quietUntil && Clock::now() >= *quietUntil) return grpc::Status::OK;
      store_.waitFor({keys_.event(next_)}, timing_.poll);
    }
  }

 private:
  // Sends events next_..last; false when the watcher went away.
  bool sendUpTo(int64_t last) {
    static constexpr int64_t kBatch = 256;  // events read in one round trip
    while (next_ <= last) {
      std::vector<std::string> keys;
      for (int64_t n = next_; n <= std::min(last, next_ + kBatch - 1); ++n)
        keys.push_back(keys_.event(n));
      for (std::string& text : store_.peek(keys)) {
        if (text.empty() && !awaitWritten(text)) return false;
        if (!writer_.Write(toProto(decoded(text)))) return false;
        ++next_;
      }
    }
    return true;
  }

  // Waits up to gapWait for event next_, counted but not written yet; on return `text` holds
  // it, or stays empty for a gap. False when the watcher went away.
  bool awaitWritten(std::string& text) {
    const auto giveUp = Clock::now() + timing_.gapWait;
    while (Clock::now() < giveUp) {
      if (context_.IsCancelled()) return false;
      using std::chrono::milliseconds;
      const auto left = std::chrono::duration_cast<milliseconds>(giveUp - Clock::now());
      if (store_.waitFor({keys_.event(next_)}, std::clamp(left, milliseconds(1), timing_.poll))) {
        text = store_.peek({keys_.event(next_)})[0];
        return true;
      }
    }
    return true;
  }

  // Event next_ from its record; a "gap" event in place of one never written or unreadable,
  // so the watcher's count stays whole and a reconnect never waits for it again.
  JobEvent decoded(const std::string& text) const {
    std::string why = "was counted but never written (its publisher died between ADD and SET)";
    if (!text.empty()) {
      try {
        JobEvent event = decodeEvent(text);
        event.seq = next_;
        return event;
      } catch (const ProtocolError& e) {
        why = std::string("is unreadable: ") + e.what();
      }
    }
    return {.seq = next_,
            .time = unixSeconds(),
            .kind = "gap",
            .detail = "event " + std::to_string(next_) + " " + why};
  }

  const WatchTiming& timing_;
  LeasingStore& store_;
  const Keys keys_;
  const elastic::Keys rounds_;
  grpc::ServerContext& context_;
  grpc::ServerWriter<v1::Event>& writer_;
  int64_t next_ = 1;
};

}  // namespace

grpc::Status ControlService::GetJob(grpc::ServerContext* context, const v1::JobRef* request,
                                    v1::Job* response) {
  return guarded([&] {
    auto store = options_.connect();
    const JobRecord job = readJob(*store, request->id(), JobParts::WithNodes);
    authorize(*context, job, false, options_.inProcess);
    fillJob(job, unixSeconds(), *response);
    return grpc::Status::OK;
  });
}

grpc::Status ControlService::ListJobs(grpc::ServerContext* context, const v1::ListJobsRequest*,
                                      v1::ListJobsResponse* response) {
  return guarded([&] {
    auto store = options_.connect();
    const std::string token = presentedToken(*context);
    for (const auto& id : lines(store->peek({Keys::jobs()})[0])) {
      std::optional<JobRecord> job;
      try {
        job = readJob(*store, id, JobParts::WithNodes);
      } catch (const Refusal&) {
        continue;  // registered, but its keys are gone
      }
      // A job with a token is listed only to callers that carry it.
      if (access(job->meta.tokenHash, token, Call{}) != Access::Granted) continue;
      const JobStatus status = statusOf(*job);
      v1::JobSummary* summary = response->add_jobs();
      summary->set_id(id);
      summary->set_state(status.state);
      summary->set_round(status.round);
      // The job's nodes: its agents, but those another agent replaced on their host.
      const auto replaced = replacedBy(job->agents);
      summary->set_nodes(static_cast<int32_t>(std::count(replaced.begin(), replaced.end(), 0)));
    }
    return grpc::Status::OK;
  });
}

grpc::Status ControlService::WatchEvents(grpc::ServerContext* context,
                                         const v1::WatchEventsRequest* request,
                                         grpc::ServerWriter<v1::Event>* writer) {
  return guarded([&] {
    auto store = options_.connect();
    const JobRecord job = readJob(*store, request->job().id(), JobParts::Status);
    authorize(*context, job, false, options_.inProcess);
    return EventStream(options_.watch, *store, job.id, *context, *writer)
        .run(request->since(), request->follow());
  });
}

grpc::Status ControlService::StopJob(grpc::ServerContext* context,
                                     const v1::StopJobRequest* request, v1::Ack* response) {
  return guarded([&] {
    auto store = options_.connect();
    const JobRecord job = readJob(*store, request->job().id(), JobParts::Status);
    authorize(*context, job, true, options_.inProcess);
    const int code = request->exit_code() == 0 ? 143 : request->exit_code();
    if (code < 1 || code > 255)
      refuse(grpc::StatusCode::INVALID_ARGUMENT,
             "exit code " + std::to_string(code) + " is out of range: give 1 to 255 (0: 143)");
    const JobStatus status = requireRunning(job);
    const std::string client = clientName(*context);
    const RoundEnd stop{.kind = RoundEnd::Kind::Stopped,
                        .node = client + " (dlrun stop)",
                        .exitCode = code,
                        .final = true,
                        .report = "job stopped by dlrun stop" +
                                  (request->reason().empty() ? "" : ": " + request->reason())};
    const RoundEnd first = rendezvous::stopJob(*store, elastic::Keys(job.id), stop);
    if (elastic::encode(first) != elastic::encode(stop)) {
      response->set_detail("job '" + job.id + "' was already stopping: " + first.report);
      return grpc::Status::OK;
    }
    // Every agent also hears it as a command: one waiting to join, or one whose rendezvous
    // does not follow the store, stops with the same code.
    const Keys keys(job.id);
    store->set(keys.signal(store->add(keys.signals(), 1)),
               encodeCommand({.kind = ControlCommand::Kind::Stop, .value = code}));
    publish(*store, Keys(job.id),
            {.kind = "stop_requested",
             .node = client,
             .round = status.round,
             .detail = stop.report + " (exit code " + std::to_string(code) + ")"});
    response->set_detail("job '" + job.id + "' is stopping: every agent stops its workers and " +
                         "exits " + std::to_string(code));
    return grpc::Status::OK;
  });
}

grpc::Status ControlService::SignalJob(grpc::ServerContext* context,
                                       const v1::SignalJobRequest* request, v1::Ack* response) {
  return guarded([&] {
    auto store = options_.connect();
    const JobRecord job = readJob(*store, request->job().id(), JobParts::Status);
    authorize(*context, job, true, options_.inProcess);
    const auto signal = parseSignal(request->signal());
    if (!signal)
      refuse(grpc::StatusCode::INVALID_ARGUMENT,
             "unknown signal '" + request->signal() + "': give a name (USR1, SIGUSR1) or a number");
    const JobStatus status = requireRunning(job);
    const Keys keys(job.id);
    const int64_t n = store->add(keys.signals(), 1);
    store->set(keys.signal(n),
               encodeCommand({.kind = ControlCommand::Kind::Signal, .value = *signal}));
    const std::string name = signalName(*signal);
    publish(*store, keys,
            {.kind = "signal_sent",
             .node = clientName(*context),
             .round = status.round,
             .detail = name + " to every worker"});
    response->set_detail(name + " sent to job '" + job.id + "' (signal " + std::to_string(n) +
                         " of the job)");
    return grpc::Status::OK;
  });
}

// A read, as GetJob: the output goes to whoever may read the job.
grpc::Status ControlService::GetLogs(grpc::ServerContext* context, const v1::LogsRequest* request,
                                     grpc::ServerWriter<v1::LogLine>* writer) {
  return guarded([&] {
    const LogRequest asked = toLogRequest(*request);
    auto store = options_.connect();
    const JobRecord job = readJob(*store, request->job().id(), JobParts::WithNodes);
    authorize(*context, job, false, options_.inProcess);
    return relayLogs(*store, job, asked, options_.logs, *context, *writer);
  });
}

}  // namespace dlrun::control
