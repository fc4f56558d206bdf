// dlrun-job-view-bench: the cost of the job's one view (issue 45) at a running dlrund: K
// simulated agents registered as agents register (ADD ctl/nodes; ctl/nodes/I, ctl/node/I and,
// from the first, ctl/meta in one MULTI_SET), each on its own store connection, then for
// --seconds either
//   --records on:  every agent rewrites its progress record ctl/prog/I once a record period (a
//                  MULTI_SET of one key, as agents/control_publisher.cpp's writeOnce sends it;
//                  the period is control::recordPeriod(K), as agents take it: 1 s up to 200
//                  agents, K / 200 s beyond), the K writes spread evenly over the period; group
//                  rank 0's straggler watch every max(2 s, period) (peek ctl/nodes, then every
//                  ctl/prog/I and the names not known yet in one request; ctl/stragglers written
//                  when it changes); and one viewer reading the whole job every max(1 s, period),
//                  as the page's watch does (--viewer: `store`, readJob + fillJob here
//                  over a connection of its own; `grpc`, GetJob on dlrund's port, which runs
//                  both inside dlrund; `page`, GET /api/job?id= on dlrund's --metrics-port
//                  (--page), whose job watch reads the job inside dlrund; `none`);
//   --records off: the same K connections, idle (the job without the page's records).
// Prints one line: records written/s, dlrund's CPU over the window (utime + stime of
// --store-pid in /proc, also split) as % of one core, this process's CPU (getrusage) per
// simulated agent as % of a core, and the record writes' time p50/p99. bench/job_view_bench.sh
// alternates the two modes and compares.
//
// The writes: --threads threads (default 1) drive the agents' connections round-robin; a thread
// sleeps until an agent's slot and writes late when behind (the line says how late the latest
// write started). MULTI_SET has no reply in TCPStore's protocol, so a write is one send and its
// time is the agent's: on loopback, the send through to dlrund's socket. One thread keeps
// 1,000 writes/s with time to spare (about 25 us a write, 90 us of CPU with the record's
// encoding); the bench's CPU per agent includes the straggler watch and the viewer.
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/cli.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/host_port.h"
#include "common/log.h"
#include "control/job_read.h"
#include "control/state/control_state.h"
#include "control/state/progress_record.h"
#include "control/state/stragglers.h"
#include "dlrun/v1/control.grpc.pb.h"
#include "store/tcp_store.h"
#include "store/tcp_stream.h"

namespace {

using namespace dlrun;
using Seconds = std::chrono::duration<double>;

struct Options {
  HostPort store;
  int storePid = 0;
  int agents = 1000;
  double seconds = 60;
  bool records = true;
  std::string job;
  int ranks = 8;
  int threads = 1;
  std::string viewer = "store";
  HostPort page;  // dlrund's --metrics-port, for --viewer page
  bool watch = true;
};

// utime and stime of a process, in seconds (all its threads).
struct Cpu {
  double user = 0, system = 0;
  double total() const { return user + system; }
  Cpu operator-(const Cpu& o) const { return {user - o.user, system - o.system}; }
};

Cpu processCpu(int pid) {
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) throw Error("cannot read " + path + ": is dlrund's pid right?");
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  Cpu cpu;
  const auto tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  // After "pid (comm) ": state is field 3; utime and stime are fields 14 and 15.
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i == 14) cpu.user = std::stod(field) / tick;
    if (i == 15) cpu.system = std::stod(field) / tick;
  }
  return cpu;
}

double selfCpu() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

std::unique_ptr<TcpStore> connectStore(const Options& o) {
  return std::make_unique<TcpStore>(TcpStoreOptions{.at = {o.store.host, o.store.port},
                                                    .timeout = std::chrono::seconds(30),
                                                    .connectTimeout = std::chrono::seconds(10),
                                                    .reconnect = false});
}

std::string hostName(int64_t index) {
  char name[32];
  std::snprintf(name, sizeof(name), "node%04lld", static_cast<long long>(index - 1));
  return name;
}

// What an agent of `ranks` workers, all running, writes as its state.
control::NodeState nodeState(int64_t index, int ranks) {
  control::NodeState state{
      .name = hostName(index),
      .address = "10.0." + std::to_string(index / 256) + "." + std::to_string(index % 256),
      .groupRank = static_cast<int>(index - 1),
      .state = "running",
      .round = 0,
      .logDir = "/tmp/dlrun/logs",
      .updated = unixSeconds(),
      .firstRound = 0};
  for (int r = 0; r < ranks; ++r)
    state.workers.push_back({.rank = static_cast<int>((index - 1) * ranks + r),
                             .localRank = r,
                             .pid = 100000 + r,
                             .state = "running"});
  return state;
}

// A record as a training job's agent writes it: 8 ranks stepping at about 3 steps/s, a loss,
// samples, one named metric.
control::NodeProgress progressRecord(int64_t index, int ranks, double elapsed) {
  control::NodeProgress p{.time = unixSeconds(), .round = 0};
  for (int r = 0; r < ranks; ++r) {
    const double rate = 3.1 + 0.01 * static_cast<double>((index * 7 + r) % 13);
    const auto step = static_cast<int64_t>(1000 + elapsed * rate);
    p.ranks.push_back({.rank = static_cast<int>((index - 1) * ranks + r),
                       .step = step,
                       .epoch = step / 5000,
                       .stepsPerSecond = rate,
                       .sinceStep = 0.12,
                       .loss = 2.31 / (1 + 0.001 * static_cast<double>(step)),
                       .samples = step * 256,
                       .metrics = {{"lr", 3e-4}}});
  }
  return p;
}

// Registration, as the publisher's first writeOnce: the count, then the name, the state and
// (the first agent's) the job's settings in one MULTI_SET; the first appends to dlrun/jobs.
void registerAgent(TcpStore& store, const control::Keys& keys, const Options& o) {
  const int64_t index = store.add(keys.nodes(), 1);
  std::vector<std::string> k{keys.node(index), keys.nodeAt(index)};
  std::vector<std::string> v{control::encode(nodeState(index, o.ranks)), hostName(index)};
  if (index == 1) {
    k.push_back(keys.meta());
    v.push_back(control::encode(control::ControlMeta{
        .backend = "c10d", .minNodes = o.agents, .maxNodes = o.agents, .maxRestarts = 3}));
  }
  store.multiSet(k, v);
  if (index == 1) store.append(control::Keys::jobs(), o.job + "\n");
}

struct Window {
  Clock::time_point start, end;
  double wallStart = 0;
};

struct WriterResult {
  std::vector<double> latencies;  // seconds
  double latest = 0;              // the most a write started after its slot
  int64_t writes = 0;
};

// Seconds between one agent's records, and the leader's and a viewer's looks, as the product
// takes them for a job of `agents`.
Clock::duration every(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(Seconds(seconds));
}

// One thread's share of the agents (index % threads == t), each at its slot in every period.
void writeRecords(const Options& o, const control::Keys& keys,
                  std::vector<std::unique_ptr<TcpStore>>& agents, const Window& w, int t,
                  WriterResult& out) {
  const Clock::duration period = every(control::recordPeriod(o.agents));
  const Clock::duration slot = period / o.agents;
  for (int64_t n = 0;; ++n) {
    for (int i = t; i < o.agents; i += o.threads) {
      const Clock::time_point due = w.start + period * n + slot * i;
      if (due >= w.end) return;
      std::this_thread::sleep_until(due);
      const int64_t index = i + 1;  // agents registered in order: agent i holds index i + 1
      const std::string record =
          control::encode(progressRecord(index, o.ranks, unixSeconds() - w.wallStart));
      const auto begin = Clock::now();
      agents[i]->multiSet({keys.progress(index)}, {record});
      const auto done = Clock::now();
      out.latencies.push_back(Seconds(done - begin).count());
      out.latest = std::max(out.latest, Seconds(begin - due).count());
      ++out.writes;
    }
  }
}

// Group rank 0's straggler watch (ControlPublisher::watchStragglers), every 2 s.
void watchStragglers(const Options& o, const control::Keys& keys, const Window& w,
                     std::vector<double>& took) {
  auto store = connectStore(o);
  control::StragglerTracker tracker(control::StragglerRule{});
  std::map<int64_t, std::string> names;
  bool first = true;
  for (auto due = w.start + std::chrono::milliseconds(500); due < w.end;
       due += std::max(every(2), every(control::recordPeriod(o.agents)))) {
    std::this_thread::sleep_until(due);
    const auto begin = Clock::now();
    const int64_t agents = storedCount(store->peek({keys.nodes()})[0], keys.nodes());
    std::vector<std::string> k;
    for (int64_t i = 1; i <= agents; ++i) k.push_back(keys.progress(i));
    for (int64_t i = 1; i <= agents; ++i)
      if (!names.contains(i)) k.push_back(keys.nodeAt(i));
    const auto values = store->peek(k);
    size_t named = static_cast<size_t>(agents);
    for (int64_t i = 1; i <= agents; ++i)
      if (!names.contains(i) && !values[named++].empty()) names[i] = values[named - 1];
    const double now = unixSeconds();
    std::vector<control::RankRate> ranks;
    for (int64_t i = 1; i <= agents; ++i) {
      const std::string& text = values[static_cast<size_t>(i - 1)];
      if (text.empty()) continue;
      const control::NodeProgress p = control::decodeNodeProgress(text);
      if (p.round != 0 || now - p.time > 10) continue;
      for (const auto& r : p.ranks)
        ranks.push_back({.rank = r.rank, .node = names[i], .stepsPerSecond = r.stepsPerSecond});
    }
    const auto changes = tracker.observe(ranks, now);
    if (first || !changes.named.empty() || !changes.cleared.empty())
      store->set(keys.stragglers(), control::encodeStragglers(tracker.named()));
    first = false;
    took.push_back(Seconds(Clock::now() - begin).count());
  }
}

// A browser's look at the job's page on dlrund's --metrics-port: GET /api/job over one kept-alive
// connection; returns the body (the page's JSON).
class PageClient {
 public:
  PageClient(const HostPort& at, const std::string& job)
      : at_(at),
        request_("GET /api/job?id=" + job + " HTTP/1.1\r\nHost: " + at.text() + "\r\n\r\n") {}

  std::string get() {
    try {
      return exchange();
    } catch (...) {
      stream_.close();  // a reply half read would put the next one out of step
      throw;
    }
  }

 private:
  std::string exchange() {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    if (!stream_.isOpen()) stream_ = TcpStream::connect(at_.host, at_.port, deadline);
    stream_.writeAll(request_, deadline);
    std::string head;
    size_t end;
    while ((end = head.find("\r\n\r\n")) == std::string::npos) {
      const std::string more = stream_.readSome(65536, deadline);
      if (more.empty()) throw Error("the page closed the connection");
      head += more;
    }
    std::string body = head.substr(end + 4);
    head.resize(end);
    std::string lower = head;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    const size_t at = lower.find("content-length:");
    if (at == std::string::npos) throw Error("the page answered without a Content-Length");
    const size_t length = std::stoul(head.substr(at + 15));
    if (body.size() < length) body += stream_.readExact(length - body.size(), deadline);
    if (head.find(" 200 ") == std::string::npos)
      throw Error("the page answered " + head.substr(0, head.find('\r')));
    return body;
  }

  HostPort at_;
  std::string request_;
  TcpStream stream_;
};

// The page's viewer: the whole job once a second.
void view(const Options& o, const Window& w, std::vector<double>& took, size_t& nodes) {
  std::unique_ptr<TcpStore> store;
  std::unique_ptr<v1::Control::Stub> stub;
  std::unique_ptr<PageClient> page;
  if (o.viewer == "store") {
    store = connectStore(o);
  } else if (o.viewer == "page") {
    page = std::make_unique<PageClient>(o.page, o.job);
    // dlrund's job watch starts at the first look and answers 202 until its first read (within
    // the window's first second).
    for (auto until = Clock::now() + std::chrono::seconds(10);;
         std::this_thread::sleep_for(std::chrono::milliseconds(100))) {
      try {
        page->get();
        break;
      } catch (const Error&) {
        if (Clock::now() > until) throw;
      }
    }
  } else {
    auto channel = grpc::CreateChannel(o.store.text(), grpc::InsecureChannelCredentials());
    if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)))
      throw Error("no control plane answers at " + o.store.text());
    stub = v1::Control::NewStub(channel);
  }
  for (auto due = w.start + std::chrono::milliseconds(250); due < w.end;
       due += std::max(every(1), every(control::recordPeriod(o.agents)))) {
    std::this_thread::sleep_until(due);
    const auto begin = Clock::now();
    v1::Job job;
    if (store) {
      control::fillJob(control::readJob(*store, o.job, control::JobParts::WithNodes), unixSeconds(),
                       job);
    } else if (page) {
      const std::string body = page->get();
      // The nodes the page lists: each has its group rank once.
      for (size_t at = 0; (at = body.find("\"group_rank\":", at)) != std::string::npos; ++at)
        job.add_nodes();
    } else {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
      v1::JobRef ref;
      ref.set_id(o.job);
      const grpc::Status status = stub->GetJob(&context, ref, &job);
      if (!status.ok()) throw Error("GetJob: " + status.error_message());
    }
    took.push_back(Seconds(Clock::now() - begin).count());
    nodes = static_cast<size_t>(job.nodes_size());
  }
}

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const auto at = static_cast<size_t>(q * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(at, values.size() - 1)];
}

// Runs `body` on a thread, keeping its first failure for the caller.
template <typename Fn>
std::thread guarded(std::mutex& mutex, std::string& failure, Fn body) {
  return std::thread([&mutex, &failure, body = std::move(body)]() mutable {
    try {
      body();
    } catch (const std::exception& e) {
      std::lock_guard lock(mutex);
      if (failure.empty()) failure = e.what();
    }
  });
}

int run(const Options& o) {
  const control::Keys keys(o.job);
  std::vector<std::unique_ptr<TcpStore>> agents;
  agents.reserve(static_cast<size_t>(o.agents));
  for (int i = 0; i < o.agents; ++i) {
    agents.push_back(connectStore(o));
    registerAgent(*agents.back(), keys, o);
  }
  // Agents register concurrently in a real job; here in order, so agent i holds index i + 1.
  if (storedCount(agents[0]->peek({keys.nodes()})[0], keys.nodes()) != o.agents)
    throw Error("job '" + o.job + "' was registered before: use a fresh --job");

  Window w;
  w.start = Clock::now() + std::chrono::milliseconds(200);
  w.end = w.start + std::chrono::duration_cast<Clock::duration>(Seconds(o.seconds));
  w.wallStart = unixSeconds() + 0.2;
  std::vector<WriterResult> writers(static_cast<size_t>(o.threads));
  std::vector<double> peeks, views;
  size_t viewed = 0;
  std::mutex mutex;
  std::string failure;

  std::this_thread::sleep_until(w.start);
  const Cpu storeBefore = processCpu(o.storePid);
  const double selfBefore = selfCpu();
  const auto measured = Clock::now();
  std::vector<std::thread> threads;
  if (o.records) {
    for (int t = 0; t < o.threads; ++t)
      threads.push_back(guarded(mutex, failure, [&, t] {
        writeRecords(o, keys, agents, w, t, writers[static_cast<size_t>(t)]);
      }));
    if (o.watch)
      threads.push_back(guarded(mutex, failure, [&] { watchStragglers(o, keys, w, peeks); }));
    if (o.viewer != "none")
      threads.push_back(guarded(mutex, failure, [&] { view(o, w, views, viewed); }));
  } else {
    std::this_thread::sleep_until(w.end);
  }
  for (auto& t : threads) t.join();
  const double elapsed = Seconds(Clock::now() - measured).count();
  const Cpu store = processCpu(o.storePid) - storeBefore;
  const double selfCpuUsed = selfCpu() - selfBefore;
  if (!failure.empty()) throw Error("a simulated agent failed: " + failure);

  std::vector<double> latencies;
  int64_t writes = 0;
  double latest = 0;
  for (auto& r : writers) {
    latencies.insert(latencies.end(), r.latencies.begin(), r.latencies.end());
    writes += r.writes;
    latest = std::max(latest, r.latest);
  }
  std::printf(
      "mode=%s agents=%d seconds=%.2f records_per_s=%.1f store_cpu_s=%.3f store_user_s=%.3f "
      "store_sys_s=%.3f store_cpu_pct=%.3f bench_cpu_s=%.3f bench_cpu_per_agent_pct=%.5f "
      "write_p50_us=%.1f write_p99_us=%.1f latest_start_ms=%.2f peeks=%zu peek_p50_ms=%.2f "
      "views=%zu view_p50_ms=%.2f viewed_nodes=%zu record_bytes=%zu\n",
      o.records ? "on" : "off", o.agents, elapsed, static_cast<double>(writes) / elapsed,
      store.total(), store.user, store.system, 100 * store.total() / elapsed, selfCpuUsed,
      100 * selfCpuUsed / elapsed / o.agents, 1e6 * percentile(latencies, 0.5),
      1e6 * percentile(latencies, 0.99), 1e3 * latest, peeks.size(), 1e3 * percentile(peeks, 0.5),
      views.size(), 1e3 * percentile(views, 0.5), viewed,
      control::encode(progressRecord(o.agents, o.ranks, 60)).size());

  // The job's keys go, outside the window, so the next run meets a store of the same size.
  auto& first = *agents[0];
  for (int64_t i = 1; i <= o.agents; ++i)
    for (const auto& key : {keys.nodeAt(i), keys.node(i), keys.progress(i)}) first.deleteKey(key);
  for (const auto& key : {keys.nodes(), keys.meta(), keys.stragglers()}) first.deleteKey(key);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  log::setProgramName("dlrun-job-view-bench");
  return guardedMain([&] {
    CLI::App app("dlrun-job-view-bench: the store's CPU for the job view's records");
    Options o;
    std::string store, records = "on";
    app.add_option("--store", store, "dlrund's HOST:PORT")->required();
    app.add_option("--store-pid", o.storePid, "dlrund's pid, for its CPU")->required();
    app.add_option("--agents", o.agents, "Simulated agents")->check(CLI::Range(1, 20000));
    app.add_option("--seconds", o.seconds, "The measured window")->check(CLI::Range(1.0, 3600.0));
    app.add_option("--records", records, "on: write the records; off: idle connections")
        ->check(CLI::IsMember({"on", "off"}));
    app.add_option("--job", o.job, "Job id (fresh per run)")->required();
    app.add_option("--ranks", o.ranks, "Ranks an agent")->check(CLI::Range(1, 1024));
    app.add_option("--threads", o.threads, "Threads driving the writes")->check(CLI::Range(1, 64));
    std::string page;
    app.add_option("--viewer", o.viewer, "store, grpc, page or none")
        ->check(CLI::IsMember({"store", "grpc", "page", "none"}));
    app.add_option("--page", page, "dlrund's --metrics-port HOST:PORT, for --viewer page");
    app.add_flag("!--no-watch", o.watch, "Leave group rank 0's straggler watch out");
    if (auto code = parseCommandLine(app, {argv + 1, argv + argc}, "dev")) return *code;
    o.store = parseHostPort(store, 29500);
    if (o.viewer == "page") {
      if (page.empty()) throw ConfigError("--viewer page needs --page HOST:PORT");
      o.page = parseHostPort(page, 80);
    }
    o.records = records == "on";
    o.threads = std::min(o.threads, o.agents);
    return run(o);
  });
}
