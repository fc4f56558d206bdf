// The control plane end to end: a store server with the ControlServer attached, a job's keys
// written by a TCPStore client as agents write them, and every Control call made through a
// gRPC channel to the same port the TCPStore clients use.
#include "control/control_server.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <optional>
#include <thread>

#include "control/access.h"
#include "control/liveness_server.h"
#include "control/state/control_state.h"
#include "rendezvous/elastic_protocol.h"
#include "store/tcp_store.h"
#include "store/tcp_stream.h"

namespace dlrun::control {
namespace {

namespace elastic = rendezvous::elastic;
using rendezvous::RoundEnd;
using std::chrono::milliseconds;

class ControlServerTest : public ::testing::Test {
 protected:
  ControlServerTest()
      : control({.poll = milliseconds(50),
                 .gapWait = milliseconds(300),
                 .endQuiet = milliseconds(1000)}),
        server({.listen = {"127.0.0.1", 0}, .foreign = [this](int fd) { control.adopt(fd); }}),
        store({.at = {"127.0.0.1", server.port()}}),
        stub(v1::Control::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(server.port()),
                                                      grpc::InsecureChannelCredentials()))) {
    control.readFrom(storeAt(server.address(), server.port()));
  }

  // A running job as its agents leave it: settings, one node with two workers, round 0 closed.
  void writeJob(const std::string& id, const std::string& token = "") {
    const Keys c(id);
    const elastic::Keys r(id);
    const ControlMeta meta{.backend = "c10d",
                           .minNodes = 1,
                           .maxNodes = 2,
                           .maxRestarts = 3,
                           .tokenHash = token.empty() ? "" : tokenHash(token)};
    store.set(c.meta(), encode(meta));
    store.append(Keys::jobs(), id + "\n");
    NodeState node{.name = "n1",
                   .address = "127.0.0.1",
                   .groupRank = 0,
                   .state = "running",
                   .round = 0,
                   .logDir = "/logs/" + id,
                   .firstRound = 0};
    node.workers.push_back({.rank = 0,
                            .localRank = 0,
                            .pid = 100,
                            .state = "running",
                            .step = 7,
                            .progressTime = 1.5});
    node.workers.push_back({.rank = 1, .localRank = 1, .pid = 101, .state = "running"});
    registerAgent(id, node);
    store.set(r.current(), "0");
    store.set(r.closed(0), "1");
    store.set(r.members(0), "m1\n");
    store.set(r.assignment(0, "m1"), elastic::encode(elastic::Assignment{.failures = 1}));
  }

  // An agent as its publisher registers it: its index, its host's name, its state under the index.
  int64_t registerAgent(const std::string& id, const NodeState& node) {
    const Keys c(id);
    const int64_t agent = store.add(c.nodes(), 1);
    store.multiSet({c.nodeAt(agent), c.node(agent)}, {node.name, encode(node)});
    return agent;
  }

  void publish(const std::string& id, const std::string& kind) {
    const Keys c(id);
    const int64_t n = store.add(c.seq(), 1);
    store.set(c.event(n),
              encode(JobEvent{.seq = n, .time = 1.0, .kind = kind, .node = "n1", .round = 0}));
  }

  // Every call has a deadline, so a server that never answers fails the test instead.
  static std::unique_ptr<grpc::ClientContext> call(const std::string& token = "") {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    if (!token.empty()) context->AddMetadata("authorization", "Bearer " + token);
    return context;
  }

  // The events of one WatchEvents call, until the stream ends.
  std::vector<v1::Event> watch(const std::string& id, int64_t since, bool follow,
                               grpc::Status* status = nullptr) {
    v1::WatchEventsRequest request;
    request.mutable_job()->set_id(id);
    request.set_since(since);
    request.set_follow(follow);
    auto context = call();
    auto reader = stub->WatchEvents(context.get(), request);
    std::vector<v1::Event> events;
    v1::Event event;
    while (reader->Read(&event)) events.push_back(event);
    const grpc::Status finished = reader->Finish();
    if (status) *status = finished;
    return events;
  }

  static std::vector<int64_t> seqs(const std::vector<v1::Event>& events) {
    std::vector<int64_t> out;
    for (const auto& e : events) out.push_back(e.seq());
    return out;
  }

  grpc::Status stop(const std::string& id, const std::string& token, v1::Ack* ack, int code = 0) {
    v1::StopJobRequest request;
    request.mutable_job()->set_id(id);
    request.set_exit_code(code);
    request.set_reason("maintenance");
    return stub->StopJob(call(token).get(), request, ack);
  }

  ControlServer control;
  StoreServerThread server;
  TcpStore store;
  std::unique_ptr<v1::Control::Stub> stub;
};

TEST_F(ControlServerTest, GetJobAndListJobsOnTheStoresOwnPort) {
  writeJob("job1");
  v1::Job job;
  v1::JobRef ref;
  ref.set_id("job1");
  ASSERT_TRUE(stub->GetJob(call().get(), ref, &job).ok());
  EXPECT_EQ(job.id(), "job1");
  EXPECT_EQ(job.backend(), "c10d");
  EXPECT_EQ(job.state(), v1::RUNNING);
  EXPECT_EQ(job.max_nodes(), 2);
  EXPECT_EQ(job.max_restarts(), 3);
  EXPECT_EQ(job.restarts_used(), 1);  // from the first member's assignment
  ASSERT_EQ(job.nodes_size(), 1);
  EXPECT_EQ(job.nodes(0).agent(), 1);
  EXPECT_EQ(job.nodes(0).log_dir(), "/logs/job1");
  ASSERT_EQ(job.nodes(0).workers_size(), 2);
  EXPECT_EQ(job.nodes(0).workers(0).step(), 7);
  EXPECT_EQ(job.nodes(0).workers(1).pid(), 101);

  // TCPStore clients go on on the same port, on connections opened before and after.
  store.set("/after", "grpc");
  EXPECT_EQ(TcpStore({.at = {"127.0.0.1", server.port()}}).get("/after"), "grpc");

  writeJob("job2");
  v1::ListJobsResponse list;
  ASSERT_TRUE(stub->ListJobs(call().get(), {}, &list).ok());
  ASSERT_EQ(list.jobs_size(), 2);
  EXPECT_EQ(list.jobs(1).id(), "job2");
  EXPECT_EQ(list.jobs(1).nodes(), 1);
}

// Each agent registers once (ctl/nodes counts, ctl/nodes/I names its host) and is listed under
// its own id: two agents of one host both, with their own workers. An agent that came back on a
// host after a loss is a new one; the lost one stays with its last state, marked as replaced,
// and is not counted among the job's nodes. A registration not named yet (its agent between the
// count and its first state) is not listed.
TEST_F(ControlServerTest, EveryAgentIsListedUnderItsOwnIdThoseOfOneHostToo) {
  writeJob("job1");
  NodeState second{.name = "n1",
                   .address = "127.0.0.1",
                   .groupRank = 1,
                   .state = "running",
                   .round = 0,
                   .firstRound = 0};
  second.workers.push_back({.rank = 2, .localRank = 0, .pid = 102, .state = "running"});
  second.workers.push_back({.rank = 3, .localRank = 1, .pid = 103, .state = "running"});
  EXPECT_EQ(registerAgent("job1", second), 2);
  NodeState lost{.name = "n2",
                 .address = "127.0.0.2",
                 .groupRank = 2,
                 .state = "running",
                 .round = 0,
                 .updated = 12.5,
                 .firstRound = 0};
  lost.workers.push_back({.rank = 4, .localRank = 0, .pid = 104, .state = "running"});
  EXPECT_EQ(registerAgent("job1", lost), 3);
  const Keys c("job1");
  store.add(c.nodes(), 1);
  NodeState back = lost;
  back.round = back.firstRound = 1;
  back.workers[0].pid = 105;
  EXPECT_EQ(registerAgent("job1", back), 5);

  v1::Job job;
  v1::JobRef ref;
  ref.set_id("job1");
  ASSERT_TRUE(stub->GetJob(call().get(), ref, &job).ok());
  ASSERT_EQ(job.nodes_size(), 4);
  std::vector<int> agents, pids;
  for (const auto& node : job.nodes()) {
    agents.push_back(node.agent());
    for (const auto& w : node.workers()) pids.push_back(w.pid());
  }
  EXPECT_EQ(agents, (std::vector<int>{1, 2, 3, 5}));
  EXPECT_EQ(pids, (std::vector<int>{100, 101, 102, 103, 104, 105}));
  EXPECT_EQ(job.nodes(0).name(), "n1");
  EXPECT_EQ(job.nodes(1).name(), "n1");
  EXPECT_EQ(job.nodes(1).group_rank(), 1);
  EXPECT_EQ(job.nodes(0).replaced_by(), 0);
  EXPECT_EQ(job.nodes(1).replaced_by(), 0);
  EXPECT_EQ(job.nodes(2).replaced_by(), 5);
  EXPECT_EQ(job.nodes(2).state(), "running");  // its last state, as it was when lost
  EXPECT_EQ(job.nodes(2).updated(), 12.5);
  EXPECT_EQ(job.nodes(3).replaced_by(), 0);
  v1::ListJobsResponse list;
  ASSERT_TRUE(stub->ListJobs(call().get(), {}, &list).ok());
  ASSERT_EQ(list.jobs_size(), 1);
  EXPECT_EQ(list.jobs(0).nodes(), 3);
}

TEST_F(ControlServerTest, AnUnknownJobIsNotFound) {
  v1::Job job;
  v1::JobRef ref;
  ref.set_id("nobody");
  const grpc::Status status = stub->GetJob(call().get(), ref, &job);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(), "no job 'nobody' on this server");
}

TEST_F(ControlServerTest, AJobWhoseAgentsPublishNoSettingsIsReadFromItsRounds) {
  const elastic::Keys r("bare");
  store.set(r.shape(), elastic::encodeShape({.minNodes = 1, .maxNodes = 4}));
  store.set(r.current(), "1");
  store.set(r.closed(1), "2");
  v1::Job job;
  v1::JobRef ref;
  ref.set_id("bare");
  ASSERT_TRUE(stub->GetJob(call().get(), ref, &job).ok());
  EXPECT_EQ(job.state(), v1::RUNNING);
  EXPECT_EQ(job.round(), 1);
  EXPECT_EQ(job.min_nodes(), 1);
  EXPECT_EQ(job.max_nodes(), 4);
  EXPECT_EQ(job.nodes_size(), 0);
}

TEST_F(ControlServerTest, WatchEventsSendsEachEventOnceFromSince) {
  writeJob("job1");
  for (const char* kind : {"round_closed", "worker_started", "worker_started"})
    publish("job1", kind);
  EXPECT_EQ(seqs(watch("job1", 0, false)), (std::vector<int64_t>{1, 2, 3}));
  const auto rest = watch("job1", 2, false);
  ASSERT_EQ(seqs(rest), (std::vector<int64_t>{3}));
  EXPECT_EQ(rest[0].kind(), "worker_started");
  EXPECT_EQ(rest[0].rank(), -1);
}

TEST_F(ControlServerTest, AFollowerGetsNewEventsAndEndsAfterTheJob) {
  writeJob("job1");
  publish("job1", "round_closed");
  std::vector<v1::Event> events;
  grpc::Status status;
  std::thread follower([&] { events = watch("job1", 0, true, &status); });
  publish("job1", "worker_exited");
  const elastic::Keys r("job1");
  store.set(r.end(0), elastic::encode(RoundEnd{.kind = RoundEnd::Kind::Finished}));
  publish("job1", "job_ended");  // after the end: an agent's last word still reaches it
  follower.join();
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(seqs(events), (std::vector<int64_t>{1, 2, 3}));
}

TEST_F(ControlServerTest, AnEventCountedButNeverWrittenIsAGap) {
  writeJob("job1");
  publish("job1", "round_closed");
  store.add(Keys("job1").seq(), 1);  // a publisher that died between ADD and SET
  publish("job1", "worker_started");
  const auto events = watch("job1", 0, false);
  ASSERT_EQ(seqs(events), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(events[1].kind(), "gap");
  EXPECT_EQ(events[2].kind(), "worker_started");
}

TEST_F(ControlServerTest, StopJobStopsEveryRoundAndLogsIt) {
  writeJob("job1");
  v1::Ack ack;
  ASSERT_TRUE(stop("job1", "", &ack, 3).ok());
  EXPECT_EQ(ack.detail(), "job 'job1' is stopping: every agent stops its workers and exits 3");
  const elastic::Keys r("job1");
  const RoundEnd written = elastic::decodeRoundEnd(store.get(r.stop()));
  EXPECT_EQ(written.kind, RoundEnd::Kind::Stopped);
  EXPECT_EQ(written.exitCode, 3);
  EXPECT_EQ(written.report, "job stopped by dlrun stop: maintenance");
  EXPECT_EQ(elastic::decodeRoundEnd(store.get(r.end(0))).exitCode, 3);
  const auto events = watch("job1", 0, false);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind(), "stop_requested");
  EXPECT_EQ(events[0].node(), "127.0.0.1");

  v1::Job job;
  v1::JobRef ref;
  ref.set_id("job1");
  ASSERT_TRUE(stub->GetJob(call().get(), ref, &job).ok());
  EXPECT_EQ(job.state(), v1::STOPPED);
  EXPECT_EQ(stop("job1", "", &ack).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(stop("job1", "", &ack, 300).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ControlServerTest, StopJobWithoutAnExitCodeExits143) {
  writeJob("job1");
  v1::Ack ack;
  ASSERT_TRUE(stop("job1", "", &ack).ok());
  EXPECT_EQ(elastic::decodeRoundEnd(store.get(elastic::Keys("job1").stop())).exitCode, 143);
}

TEST_F(ControlServerTest, SignalJobCountsTheSignalForEveryAgent) {
  writeJob("job1");
  v1::SignalJobRequest request;
  request.mutable_job()->set_id("job1");
  request.set_signal("usr1");
  v1::Ack ack;
  ASSERT_TRUE(stub->SignalJob(call().get(), request, &ack).ok());
  const Keys c("job1");
  EXPECT_EQ(store.get(c.signals()), "1");
  EXPECT_EQ(store.get(c.signal(1)), std::to_string(SIGUSR1));
  const auto events = watch("job1", 0, false);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind(), "signal_sent");
  EXPECT_EQ(events[0].detail(), "SIGUSR1 to every worker");

  request.set_signal("USR3");
  const grpc::Status bad = stub->SignalJob(call().get(), request, &ack);
  EXPECT_EQ(bad.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(store.get(c.signals()), "1");
}

TEST_F(ControlServerTest, AJobWithATokenRefusesCallsWithoutItAndChangesNothing) {
  writeJob("secure", "s3cret");
  v1::Job job;
  v1::JobRef ref;
  ref.set_id("secure");
  EXPECT_EQ(stub->GetJob(call().get(), ref, &job).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(stub->GetJob(call("wrong").get(), ref, &job).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  v1::Ack ack;
  EXPECT_EQ(stop("secure", "", &ack).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(stop("secure", "wrong", &ack).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_FALSE(store.check({elastic::Keys("secure").stop()}));
  v1::ListJobsResponse list;
  ASSERT_TRUE(stub->ListJobs(call().get(), {}, &list).ok());
  EXPECT_EQ(list.jobs_size(), 0);

  ASSERT_TRUE(stub->GetJob(call("s3cret").get(), ref, &job).ok());
  EXPECT_EQ(job.state(), v1::RUNNING);
  ASSERT_TRUE(stub->ListJobs(call("s3cret").get(), {}, &list).ok());
  EXPECT_EQ(list.jobs_size(), 1);
  ASSERT_TRUE(stop("secure", "s3cret", &ack).ok());
  EXPECT_TRUE(store.check({elastic::Keys("secure").stop()}));
}

// TORCHELASTIC_HEALTH_CHECK_PORT's plain answer: an HTTP probe gets 200 at once, and a TCP
// probe that sends nothing gets it too.
TEST(LivenessServer, AnswersEveryProbeAlive) {
  LivenessServer liveness("127.0.0.1", 0);
  const std::string alive =
      "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 6\r\n"
      "Connection: close\r\n\r\nalive\n";
  for (const std::string request : {"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", ""}) {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    auto probe = TcpStream::connect("127.0.0.1", liveness.port(), deadline);
    if (!request.empty()) probe.writeAll(request, deadline);
    EXPECT_EQ(probe.readExact(alive.size(), deadline), alive);
    EXPECT_TRUE(probe.awaitClose(deadline));
  }
}

// The ids ListJobs answers on the gRPC port at 127.0.0.1:port.
std::vector<std::string> listJobsAt(uint16_t port) {
  auto stub = v1::Control::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  v1::ListJobsResponse list;
  const grpc::Status status = stub->ListJobs(&context, {}, &list);
  EXPECT_TRUE(status.ok()) << status.error_message();
  std::vector<std::string> ids;
  for (const auto& job : list.jobs()) ids.push_back(job.id());
  return ids;
}

// What an agent serving its job's store runs: both on one port.
TEST(StoreWithControlTest, ServesTheStoreAndTheControlPlaneOnItsPort) {
  StoreWithControl served({.listen = {"127.0.0.1", 0}});
  const uint16_t port = served.store().port();
  TcpStore store({.at = {"127.0.0.1", port}});
  store.set(Keys("job1").meta(), encode(ControlMeta{.backend = "c10d"}));
  store.append(Keys::jobs(), "job1\n");
  EXPECT_EQ(listJobsAt(port), std::vector<std::string>{"job1"});
}

// Under etcd an agent serves the control plane on its workers' store's port, reading the job
// from another store (etcd): what the connector opens, not the store it sits on.
TEST(StoreWithControlTest, ReadsTheJobsFromTheStoreItsConnectorOpens) {
  StoreServerThread jobs({.listen = {"127.0.0.1", 0}});
  TcpStore writer({.at = {"127.0.0.1", jobs.port()}});
  writer.set(Keys("elsewhere").meta(), encode(ControlMeta{.backend = "etcd"}));
  writer.append(Keys::jobs(), "elsewhere\n");
  StoreWithControl served({.listen = {"127.0.0.1", 0}}, storeAt("127.0.0.1", jobs.port()));
  EXPECT_EQ(listJobsAt(served.store().port()), std::vector<std::string>{"elsewhere"});
}

// Every agent on the endpoint's host tries to serve; those that lose the bind must fail the
// way the launcher expects (it goes on as a client).
TEST(StoreWithControlTest, ATakenPortIsANetworkError) {
  StoreServerThread first({.listen = {"127.0.0.1", 0}});
  EXPECT_THROW(StoreWithControl({.listen = {"127.0.0.1", first.port()}}), NetworkError);
}

// The gRPC server is built on the first HTTP/2 connection: a client that connects the moment the
// port listens is served (its SETTINGS frame, gRPC's first answer), not dropped.
TEST(StoreWithControlTest, AGrpcClientThatConnectsAsSoonAsThePortListensIsServed) {
  uint16_t port = 0;
  {
    StoreServerThread probe({.listen = {"127.0.0.1", 0}});
    port = probe.port();
  }  // a port that was free a moment ago
  std::atomic<bool> stop{false};
  std::string outcome = "never connected";
  std::thread client([&] {
    const auto deadline = Clock::now() + std::chrono::seconds(20);
    TcpStream stream;
    while (!stream.isOpen()) {
      if (stop || Clock::now() > deadline) return;
      try {
        stream = TcpStream::connect("127.0.0.1", port, deadline);
      } catch (const ConnectionRefused&) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));  // not listening yet
      }
    }
    try {
      stream.writeAll(std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") +
                          std::string("\0\0\0\x04\0\0\0\0\0", 9),  // an empty SETTINGS
                      deadline);
      const std::string frame = stream.readExact(9, deadline);
      outcome = frame[3] == '\x04' ? "served" : "not a SETTINGS frame";
    } catch (const NetworkError& e) {
      outcome = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the client is trying
  std::optional<StoreWithControl> served;
  try {
    served.emplace(StoreServerOptions{.listen = {"127.0.0.1", port}});
  } catch (const NetworkError&) {
    stop = true;
    client.join();
    GTEST_SKIP() << "port " << port << " was taken meanwhile";
  }
  client.join();
  EXPECT_EQ(outcome, "served");
}

}  // namespace
}  // namespace dlrun::control
