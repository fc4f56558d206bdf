#include "launcher/control_cli.h"

#include <grpcpp/grpcpp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <tuple>

#include "agents/console_dedup.h"
#include "common/cli.h"
#include "common/error.h"
#include "common/host_port.h"
#include "common/signal_name.h"
#include "control/control_server.h"
#include "control/job_read.h"
#include "dlrun/v1/control.grpc.pb.h"
#include "launcher/control_top.h"
#include "launcher/launch_cli.h"
#include "rendezvous/elastic_protocol.h"
#include "slurm/discovery.h"

namespace dlrun::launcher {

namespace {

namespace v1 = dlrun::v1;

using control::protoJson;

// Where the job's control plane is asked, for messages.
std::string whereOf(const ControlRequest& r) {
  if (r.etcd) return "etcd " + rendezvous::etcd::describe(r.etcd->client.endpoints);
  return r.store.text();
}

// A failed call as one line: what the user can do about it.
[[noreturn]] void fail(const ControlRequest& r, const grpc::Status& status) {
  const std::string where = whereOf(r);
  switch (status.error_code()) {
    case grpc::StatusCode::NOT_FOUND:
      throw ConfigError("no job '" + r.jobId + "' at " + where + " (--rdzv-id)");
    case grpc::StatusCode::UNAUTHENTICATED:
      throw ConfigError("the job at " + where + " refused the call: " + status.error_message() +
                        " (--token-file or DLRUN_TOKEN)");
    case grpc::StatusCode::PERMISSION_DENIED:
      throw ConfigError("the job at " + where + " refused the call: " + status.error_message());
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::INVALID_ARGUMENT: throw ConfigError(status.error_message());
    case grpc::StatusCode::UNIMPLEMENTED:
      throw ConfigError(where + " is not a dlrun control plane (" + status.error_message() + ")");
    default:
      if (r.etcd)
        throw ConfigError("cannot read job '" + r.jobId + "' from " + where +
                          " (--rdzv-endpoint): " + status.error_message());
      throw ConfigError("no dlrun control plane answers at " + where +
                        " (--rdzv-endpoint): " + status.error_message());
  }
}

void authorize(const ControlRequest& r, grpc::ClientContext& context, bool stream = false) {
  if (!r.token.empty()) context.AddMetadata("authorization", "Bearer " + r.token);
  if (!stream) context.set_deadline(std::chrono::system_clock::now() + r.timeout);
}

std::unique_ptr<v1::Control::Stub> connect(const ControlRequest& r) {
  auto channel = grpc::CreateChannel(r.store.text(), grpc::InsecureChannelCredentials());
  // A bounded wait for the connection: an address nobody listens on, or something that never
  // speaks HTTP/2, is one line, not a hang.
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + r.timeout))
    throw ConfigError("no dlrun control plane answers at " + whereOf(r) + " (--rdzv-endpoint)");
  return v1::Control::NewStub(channel);
}

v1::Job getJob(const ControlRequest& r, v1::Control::Stub& stub) {
  grpc::ClientContext context;
  authorize(r, context);
  v1::JobRef ref;
  ref.set_id(r.jobId);
  v1::Job job;
  const grpc::Status s = stub.GetJob(&context, ref, &job);
  if (!s.ok()) fail(r, s);
  return job;
}

int status(const ControlRequest& r, v1::Control::Stub& stub) {
  const v1::Job job = getJob(r, stub);
  std::cout << (r.json ? protoJson(job) + "\n" : formatJob(job));
  return 0;
}

// top's looks: the job, and the events after the last one it showed (not followed).
TopSource topSource(const ControlRequest& r, v1::Control::Stub& stub) {
  return {.job = [&r, &stub] { return getJob(r, stub); },
          .events =
              [&r, &stub](int64_t since) {
                grpc::ClientContext context;
                authorize(r, context);
                v1::WatchEventsRequest request;
                request.mutable_job()->set_id(r.jobId);
                request.set_since(since);
                auto reader = stub.WatchEvents(&context, request);
                std::vector<v1::Event> out;
                for (v1::Event event; reader->Read(&event);) out.push_back(event);
                const grpc::Status s = reader->Finish();
                if (!s.ok()) fail(r, s);
                return out;
              }};
}

int events(const ControlRequest& r, v1::Control::Stub& stub) {
  grpc::ClientContext context;
  authorize(r, context, r.follow);
  v1::WatchEventsRequest request;
  request.mutable_job()->set_id(r.jobId);
  request.set_since(r.since);
  request.set_follow(r.follow);
  auto reader = stub.WatchEvents(&context, request);
  v1::Event event;
  while (reader->Read(&event))
    std::cout << (r.json ? protoJson(event) + "\n" : formatEvent(event)) << std::flush;
  const grpc::Status s = reader->Finish();
  if (!s.ok()) fail(r, s);
  return 0;
}

int logs(const ControlRequest& r, v1::Control::Stub& stub) {
  grpc::ClientContext context;
  authorize(r, context, true);  // a log may be long to send: no deadline on the whole stream
  v1::LogsRequest request = r.logs;
  request.mutable_job()->set_id(r.jobId);
  auto reader = stub.GetLogs(&context, request);
  const bool prefixed = !request.has_rank();
  v1::LogLine line;
  bool any = false;
  while (reader->Read(&line)) {
    any = true;
    std::cout << (r.json ? protoJson(line) + "\n"
                         : formatLogLine(line, prefixed, request.grouped()));
    if (request.follow()) std::cout << std::flush;
  }
  std::cout << std::flush;
  const grpc::Status s = reader->Finish();
  // An agent lost mid-stream: what it sent stands, the loss is the one line.
  if (!s.ok() && any) throw ConfigError(s.error_message());
  if (!s.ok()) fail(r, s);
  return 0;
}

int stop(const ControlRequest& r, v1::Control::Stub& stub) {
  grpc::ClientContext context;
  authorize(r, context);
  v1::Ack ack;
  grpc::Status s;
  if (r.signal) {
    v1::SignalJobRequest request;
    request.mutable_job()->set_id(r.jobId);
    request.set_signal(std::to_string(*r.signal));
    s = stub.SignalJob(&context, request, &ack);
  } else {
    v1::StopJobRequest request;
    request.mutable_job()->set_id(r.jobId);
    request.set_exit_code(r.exitCode);
    request.set_reason(r.reason);
    s = stub.StopJob(&context, request, &ack);
  }
  if (!s.ok()) fail(r, s);
  std::cout << (r.json ? protoJson(ack) : ack.detail()) << "\n";
  return 0;
}

struct LogsFlags {
  std::optional<int> rank;
  std::string node;
  std::optional<int> attempt;
  std::string stream = "both";
  bool follow = false;
  std::optional<int64_t> tail;
  std::string grep;
  bool grouped = false;
};

void addLogsFlags(CLI::App& app, LogsFlags& f) {
  app.add_option("rank,--rank", f.rank, "The rank whose output to show")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--node", f.node, "Every rank of this node (its host's name)");
  app.add_option("--attempt", f.attempt, "attempt_N of the log tree (default: the newest)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--stream", f.stream, "out, err or both (default)")
      ->check(CLI::IsMember({"out", "err", "both"}));
  app.add_flag("-f,--follow", f.follow, "Keep showing new lines until interrupted");
  app.add_option("--tail", f.tail, "Only the last lines of each stream")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--grep", f.grep, "Only lines that contain this text");
  app.add_flag("--grouped", f.grouped,
               "The job-wide view: each distinct line once, with the ranks and nodes that "
               "printed it (the last 1,000 lines a stream unless --tail says)");
}

v1::LogsRequest logsRequest(const LogsFlags& f) {
  if (f.grouped && f.follow)
    throw ConfigError("--grouped shows the output so far: it cannot --follow");
  if (f.grouped && f.rank)
    throw ConfigError("--grouped is a view of several ranks: give --node or nothing, not a rank");
  v1::LogsRequest out;
  if (f.rank) out.mutable_rank()->set_value(*f.rank);
  if (f.attempt) out.mutable_attempt()->set_value(*f.attempt);
  if (f.tail) out.mutable_tail()->set_value(*f.tail);
  out.set_node(f.node);
  out.set_streams(f.stream);
  out.set_follow(f.follow);
  out.set_grep(f.grep);
  out.set_grouped(f.grouped);
  return out;
}

}  // namespace

const char* stateName(v1::JobState state) {
  switch (state) {
    case v1::FORMING: return "forming";
    case v1::RUNNING: return "running";
    case v1::RESTARTING: return "restarting";
    case v1::SUCCEEDED: return "succeeded";
    case v1::FAILED: return "failed";
    case v1::STOPPED: return "stopped";
    default: return "unknown";
  }
}

std::string clockTime(double unixSeconds) {
  const std::time_t seconds = static_cast<std::time_t>(unixSeconds);
  std::tm utc{};
  ::gmtime_r(&seconds, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%H:%M:%S", &utc);
  return text;
}

bool isControlCommand(const std::vector<std::string>& args) {
  return !args.empty() &&
         (args.front() == "status" || args.front() == "events" || args.front() == "stop" ||
          args.front() == "top" || args.front() == "logs");
}

ControlParse parseControlArgs(const std::vector<std::string>& args,
                              const std::map<std::string, std::string>& env) {
  ControlParse result;
  ControlRequest& r = result.request;
  r.command = args.at(0);
  CLI::App app("dlrun " + r.command + ": the control plane of a running dlrun job",
               "dlrun " + r.command);
  std::string endpoint, tokenFile, signal, backend = "c10d", conf;
  double timeout = 5;
  app.add_option("--rdzv-backend,--rdzv_backend", backend,
                 "The job's rendezvous backend: c10d (or static, slurm: its store's port) or etcd");
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", endpoint,
                 "HOST[:PORT] of the job's rendezvous store (port 29400); with etcd, "
                 "HOST[:PORT],... (port 2379, else DLRUN_ETCD_ENDPOINTS)");
  app.add_option("--rdzv-conf,--rdzv_conf", conf,
                 "With etcd: the job's etcd_prefix, cacert, cert, key, user, password, "
                 "password_file, as for the launch");
  app.add_option("--rdzv-id,--rdzv_id", r.jobId, "The job's rendezvous id");
  app.add_flag("--json", r.json, "Print JSON for scripts");
  app.add_option("--token-file", tokenFile, "The job's token (else DLRUN_TOKEN)");
  app.add_option("--timeout", timeout, "Seconds each call may take")
      ->check(CLI::Range(0.1, 3600.0));
  if (r.command == "events") {
    app.add_flag("-f,--follow", r.follow, "Keep following new events until the job ends");
    app.add_option("--since", r.since, "Only events after this sequence number")
        ->check(CLI::NonNegativeNumber);
  }
  double interval = 1;
  if (r.command == "top") {
    app.add_option("--interval", interval, "Seconds between frames (default 1)")
        ->check(CLI::Range(0.1, 3600.0));
    app.add_flag("--once", r.once, "Print one frame and exit (no screen control)");
  }
  LogsFlags logsFlags;
  if (r.command == "logs") addLogsFlags(app, logsFlags);
  if (r.command == "stop") {
    app.add_option("--signal", signal, "Send this signal (USR1, SIGUSR1, 10) instead");
    app.add_option("--exit-code", r.exitCode, "What every agent exits with (default 143)")
        ->check(CLI::Range(0, 255));
    app.add_option("--reason", r.reason, "Said in the job's logs and events");
  }
  result.exitCode = parseCommandLine(app, {args.begin() + 1, args.end()}, "dlrun");
  if (result.exitCode) return result;
  r.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000));
  r.interval = std::chrono::milliseconds(static_cast<int64_t>(interval * 1000));
  if (r.command == "logs") r.logs = logsRequest(logsFlags);
  if (r.command == "top" && r.json)
    throw ConfigError("--json: dlrun top draws a screen; dlrun status --json prints the job");
  if (!signal.empty()) {
    r.signal = parseSignal(signal);
    if (!r.signal) throw ConfigError("--signal: '" + signal + "' is no signal (say USR1 or 10)");
  }
  const bool etcd = parseRdzvBackend(backend).backend == RdzvBackend::Etcd;
  if (etcd && endpoint.empty()) {
    if (auto it = env.find("DLRUN_ETCD_ENDPOINTS"); it != env.end()) endpoint = it->second;
  }
  // Inside an allocation, the endpoint and id the launcher derives there (under etcd, the id).
  if ((endpoint.empty() || r.jobId.empty()) && slurm::detected(env)) {
    const slurm::Settings s = slurm::discover(
        env, {.rdzvEndpoint = etcd || !endpoint.empty(), .rdzvId = !r.jobId.empty()});
    if (endpoint.empty() && s.endpoint) endpoint = s.endpoint->text();
    if (r.jobId.empty() && s.rdzvId) r.jobId = *s.rdzvId;
  }
  if (endpoint.empty()) throw ConfigError("--rdzv-endpoint is needed (outside Slurm)");
  if (r.jobId.empty()) throw ConfigError("--rdzv-id is needed (outside Slurm)");
  const RdzvSettings settings = parseRdzvSettings(parseRdzvConf(conf));
  if (etcd) {
    std::vector<rendezvous::etcd::Endpoint> endpoints;
    try {
      endpoints = rendezvous::etcd::parseEndpoints(endpoint);
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("--rdzv-endpoint: ") + e.what());
    }
    // Each call's deadline bounds reaching etcd too: a dead cluster is one line in time.
    r.etcd = rendezvous::etcd::EtcdStoreOptions{
        .client = {.endpoints = endpoints,
                   .timeout = r.timeout,
                   .connectTimeout = r.timeout,
                   .security = etcdSecurity(settings, endpoints)},
        .prefix = settings.etcdJobPrefix(r.jobId),
        .root = rendezvous::elastic::Keys(r.jobId).root(),
        .timeout = r.timeout};
  } else {
    if (!conf.empty()) throw ConfigError("--rdzv-conf: only --rdzv-backend=etcd reads it");
    r.store = parseRdzvEndpoint(endpoint);
  }
  if (!tokenFile.empty()) {
    r.token = readTokenFile("--token-file", tokenFile);
  } else if (auto it = env.find("DLRUN_TOKEN"); it != env.end()) {
    r.token = it->second;
  }
  return result;
}

int runControl(const ControlRequest& request) {
  // Under etcd no process of the job owns the rendezvous: every agent serves the service on its
  // workers' store's port, but none of those ports is known here and any agent may be gone.
  // What the user named is etcd, so this process serves the same service over the job's keys
  // there and calls it in process: the same answers as from an agent, and for a job whose
  // agents all ended too. (Reaching etcd needs no more than the launch did.)
  std::optional<control::ControlServer> local;
  std::unique_ptr<v1::Control::Stub> stub;
  if (request.etcd) {
    local.emplace(control::WatchTiming{}, true);
    local->readFrom([options = *request.etcd] {
      return std::make_unique<rendezvous::etcd::EtcdStore>(options);
    });
    stub = v1::Control::NewStub(local->inProcessChannel());
  } else {
    stub = connect(request);
  }
  if (request.command == "status") return status(request, *stub);
  if (request.command == "events") return events(request, *stub);
  if (request.command == "top") return top(request, topSource(request, *stub));
  if (request.command == "logs") return logs(request, *stub);
  return stop(request, *stub);
}

std::string formatJob(const v1::Job& job) {
  // Agents another one replaced on their host (came back after a loss) go last, without the
  // workers of their last state: those are gone with them.
  std::vector<const v1::Node*> nodes;
  for (const auto& node : job.nodes()) nodes.push_back(&node);
  std::sort(nodes.begin(), nodes.end(), [](const v1::Node* a, const v1::Node* b) {
    return std::tuple(a->replaced_by() != 0, a->group_rank(), a->agent()) <
           std::tuple(b->replaced_by() != 0, b->group_rank(), b->agent());
  });
  const auto inPlace = std::count_if(nodes.begin(), nodes.end(),
                                     [](const v1::Node* n) { return n->replaced_by() == 0; });
  std::ostringstream out;
  out << "job " << job.id() << " (" << job.backend() << "): " << stateName(job.state())
      << ", round " << job.round() << ", nodes " << inPlace << " of " << job.min_nodes() << ":"
      << job.max_nodes() << ", restarts " << job.restarts_used() << " of " << job.max_restarts()
      << "\n";
  out << std::left << std::setw(6) << "GROUP" << std::setw(6) << "AGENT" << std::setw(24) << "NODE"
      << std::setw(18) << "ADDRESS" << std::setw(10) << "STATE" << std::setw(7) << "RANK"
      << std::setw(7) << "LOCAL" << std::setw(9) << "PID" << std::setw(11) << "WORKER"
      << "EXIT/STEP\n";
  for (const v1::Node* node : nodes) {
    const bool replaced = node->replaced_by() != 0;
    const bool grouped = !replaced && node->group_rank() >= 0;  // not when sitting out
    out << std::setw(6) << (grouped ? std::to_string(node->group_rank()) : "-") << std::setw(6)
        << node->agent() << std::setw(24) << node->name() << std::setw(18) << node->address()
        << std::setw(10) << (replaced ? "replaced" : node->state());
    if (replaced) {
      out << "by agent " << node->replaced_by() << "; last " << node->state() << " in round "
          << node->round() << " at " << clockTime(node->updated()) << " UTC\n";
      continue;
    }
    if (!node->sitting_out().empty()) out << " " << node->sitting_out();
    if (node->workers().empty()) out << "\n";
    bool first = true;
    for (const auto& w : node->workers()) {
      if (!first) out << std::setw(64) << "";
      first = false;
      std::string last = w.exit();
      if (last.empty() && w.step() >= 0) last = "step " + std::to_string(w.step());
      out << std::setw(7) << w.rank() << std::setw(7) << w.local_rank() << std::setw(9) << w.pid()
          << std::setw(11) << w.state() << last << "\n";
    }
  }
  if (!job.root_cause().empty()) out << "root cause:\n" << job.root_cause();
  return out.str();
}

std::string formatEvent(const v1::Event& e) {
  std::ostringstream out;
  out << std::right << std::setw(5) << e.seq() << "  " << clockTime(e.time()) << "  " << std::left
      << std::setw(15) << e.kind() << " round " << e.round();
  if (!e.node().empty()) out << "  " << e.node();
  if (e.agent() > 0) out << " (agent " << e.agent() << ")";
  if (e.rank() >= 0) out << "  rank " << e.rank();
  if (!e.detail().empty()) out << ": " << e.detail();
  out << "\n";
  return out.str();
}

std::string formatLogLine(const v1::LogLine& line, bool prefixed, bool grouped) {
  std::string out;
  if (grouped) {
    std::string ranks = agents::ranksPrefix({line.ranks().begin(), line.ranks().end()});
    ranks.pop_back();  // its ':'
    out = ranks + " ";
    if (line.nodes_size() > 3) {
      out += std::to_string(line.nodes_size()) + " nodes";
    } else {
      for (int i = 0; i < line.nodes_size(); ++i) out += (i ? "," : "") + line.nodes(i);
    }
    if (line.count() > line.ranks_size()) out += ", " + std::to_string(line.count()) + " times";
    out += ": ";
  } else if (prefixed && line.ranks_size() > 0) {
    out = "[" + std::to_string(line.ranks(0)) + "]: ";
  }
  return out + line.text() + "\n";
}

}  // namespace dlrun::launcher
