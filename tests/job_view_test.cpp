// The job's one view over a real store server: GetJob's ranks with their pace and the
// stragglers from the agents' records, and the page's /api/job (control/job_watch.h): a first
// request that waits for the first reading, the job as JSON with its curve and events, and the
// errors a bad request or an unknown job gets.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "control/control_server.h"
#include "control/job_read.h"
#include "control/job_watch.h"
#include "control/state/control_state.h"
#include "control/state/progress_record.h"
#include "control/state/stragglers.h"
#include "rendezvous/elastic_protocol.h"
#include "store/store_server.h"
#include "store/tcp_store.h"

namespace dlrun::control {
namespace {

namespace elastic = rendezvous::elastic;
using nlohmann::json;
using std::chrono::milliseconds;

class JobViewTest : public ::testing::Test {
 protected:
  JobViewTest()
      : server({.listen = {"127.0.0.1", 0}}), store({.at = {"127.0.0.1", server.port()}}) {}

  // A running job of one agent with two ranks, each with a record of its pace; rank 1 slow.
  void writeJob(const std::string& id, const std::string& tokenHash = "") {
    const Keys c(id);
    const elastic::Keys r(id);
    store.set(c.meta(),
              encode(ControlMeta{.backend = "c10d", .maxNodes = 2, .tokenHash = tokenHash}));
    NodeState node{.name = "n1", .groupRank = 0, .state = "running", .round = 0, .firstRound = 0};
    node.workers.push_back({.rank = 0, .pid = 100, .state = "running"});
    node.workers.push_back({.rank = 1, .pid = 101, .state = "running"});
    const double now = unixSeconds();
    NodeProgress progress{.time = now, .round = 0};
    progress.ranks.push_back({.rank = 0, .step = 40, .stepsPerSecond = 4, .loss = 0.5});
    progress.ranks.push_back(
        {.rank = 1, .step = 10, .stepsPerSecond = 1, .loss = 0.75, .metrics = {{"lr", 0.1}}});
    const int64_t agent = store.add(c.nodes(), 1);
    store.multiSet({c.nodeAt(agent), c.node(agent), c.progress(agent)},
                   {"n1", encode(node), encode(progress)});
    store.set(
        c.stragglers(),
        encodeStragglers(
            {{1,
              {.rank = 1, .node = "n1", .stepsPerSecond = 1, .median = 2.5, .below = now - 31}}}));
    store.set(r.current(), "0");
    store.set(r.closed(0), "1");
    store.set(c.event(store.add(c.seq(), 1)), encode(JobEvent{.time = now,
                                                              .kind = "straggler",
                                                              .node = "n1",
                                                              .rank = 1,
                                                              .detail = "rank 1 is slow"}));
  }

  JobWatchOptions watchOptions(std::string own = "") {
    return {.connect = storeAt(server.address(), server.port()),
            .ownJob = std::move(own),
            .every = milliseconds(20)};
  }

  // Asks until the watch has read the job once.
  static metrics::HttpReply firstReading(JobWatch& watch, std::string_view query) {
    const auto giveUp = Clock::now() + std::chrono::seconds(10);
    metrics::HttpReply reply = watch.api(query);
    while (reply.status == 202 && Clock::now() < giveUp) {
      std::this_thread::yield();
      reply = watch.api(query);
    }
    return reply;
  }

  StoreServerThread server;
  TcpStore store;
};

TEST_F(JobViewTest, GetJobShowsEachRanksPaceAndTheStragglers) {
  writeJob("job");
  const JobRecord record = readJob(store, "job", JobParts::WithNodes);
  v1::Job job;
  fillJob(record, unixSeconds(), job);
  ASSERT_EQ(job.nodes_size(), 1);
  const auto& slow = job.nodes(0).workers(1);
  EXPECT_TRUE(slow.reported());
  EXPECT_EQ(slow.step(), 10);
  EXPECT_EQ(slow.steps_per_second(), 1);
  EXPECT_TRUE(slow.has_loss());
  EXPECT_EQ(slow.loss(), 0.75);
  EXPECT_FALSE(slow.has_accuracy());
  EXPECT_EQ(slow.metrics().at("lr"), 0.1);
  EXPECT_TRUE(slow.straggler());
  EXPECT_FALSE(job.nodes(0).workers(0).straggler());
  ASSERT_EQ(job.stragglers_size(), 1);
  EXPECT_EQ(job.stragglers(0).rank(), 1);
  EXPECT_GE(job.stragglers(0).seconds(), 31);
}

TEST_F(JobViewTest, ARecordOfAnotherRoundOrUnreadableOneShowsNoPace) {
  writeJob("job");
  const Keys c("job");
  store.set(c.progress(1), encode(NodeProgress{.time = 1, .round = 7, .ranks = {{.rank = 0}}}));
  v1::Job job;
  fillJob(readJob(store, "job", JobParts::WithNodes), unixSeconds(), job);
  EXPECT_FALSE(job.nodes(0).workers(0).reported());
  store.set(c.progress(1), "garbage");
  store.set(c.stragglers(), "garbage");
  // The rest of the job still shows.
  fillJob(readJob(store, "job", JobParts::WithNodes), unixSeconds(), job);
  EXPECT_FALSE(job.nodes(0).workers(0).reported());
}

// A node whose checks failed is listed with why, and without a group rank or workers.
TEST_F(JobViewTest, ANodeSittingOutIsListedWithWhy) {
  writeJob("job");
  const Keys c("job");
  const int64_t agent = store.add(c.nodes(), 1);
  store.multiSet({c.nodeAt(agent), c.node(agent)},
                 {"n2", encode(NodeState{.name = "n2",
                                         .state = kSittingOut,
                                         .sittingOut = SittingOut{.cause = kQuarantine,
                                                                  .reason = "quarantined: x"}})});
  v1::Job job;
  fillJob(readJob(store, "job", JobParts::WithNodes), unixSeconds(), job);
  ASSERT_EQ(job.nodes_size(), 2);
  EXPECT_EQ(job.nodes(0).sitting_out(), "");
  const v1::Node& out = job.nodes(1);
  EXPECT_EQ(out.state(), "sitting_out");
  EXPECT_EQ(out.sitting_out(), "quarantined: x");
  EXPECT_EQ(out.sitting_out_cause(), "quarantine");
  EXPECT_EQ(out.group_rank(), -1);
  EXPECT_EQ(out.workers_size(), 0);
  EXPECT_NE(protoJson(job).find(R"("sitting_out":"quarantined: x")"), std::string::npos);
}

TEST_F(JobViewTest, ThePageReadsTheJobOnceAskedThenAnswersWithItsCurveAndEvents) {
  writeJob("job");
  JobWatch watch(watchOptions("job"));
  const metrics::HttpReply reply = firstReading(watch, "");
  ASSERT_EQ(reply.status, 200) << reply.body;
  EXPECT_EQ(reply.contentType, "application/json");
  const json answer = json::parse(reply.body);
  EXPECT_EQ(answer["job"]["id"], "job");
  EXPECT_EQ(answer["job"]["nodes"][0]["workers"][1]["straggler"], true);
  ASSERT_EQ(answer["curve"].size(), 1u);
  EXPECT_EQ(answer["curve"][0][1], 40);   // rank 0's step
  EXPECT_EQ(answer["curve"][0][2], 0.5);  // its loss
  EXPECT_EQ(answer["curve"][0][4], 1.0);  // the slowest pace
  EXPECT_EQ(answer["curve"][0][5], 2.5);  // the median
  ASSERT_EQ(answer["events"].size(), 1u);
  EXPECT_EQ(answer["events"][0]["kind"], "straggler");
  EXPECT_EQ(watch.api("id=job").status, 200);
}

TEST_F(JobViewTest, AnEventCountedButNotYetWrittenIsWaitedFor) {
  writeJob("job");
  JobWatch watch(watchOptions("job"));
  const Keys c("job");
  const int64_t late = store.add(c.seq(), 1);  // numbered; its publisher writes it next
  ASSERT_EQ(firstReading(watch, "").status, 200);
  store.set(c.event(late), encode(JobEvent{.time = unixSeconds(), .kind = "worker_failed"}));
  const auto giveUp = Clock::now() + std::chrono::seconds(2);  // within the 3 s it waits
  json answer;
  do {
    answer = json::parse(watch.api("").body);
  } while (answer["events"].size() < 2 && Clock::now() < giveUp);
  ASSERT_EQ(answer["events"].size(), 2u) << answer["events"].dump();
  EXPECT_EQ(answer["events"][1]["kind"], "worker_failed");
}

TEST_F(JobViewTest, BadRequestsAndUnknownJobsGetAClearError) {
  writeJob("job");
  JobWatch own(watchOptions("job"));
  EXPECT_EQ(own.api("id=other").status, 404);
  EXPECT_EQ(own.api("id=a%20b").status, 400);
  EXPECT_EQ(own.api("id=").status, 400);
  JobWatch any(watchOptions());
  EXPECT_EQ(any.api("").status, 400);  // dlrund serves many: name one
  const auto unknown = firstReading(any, "id=nobody");
  EXPECT_EQ(unknown.status, 404);
  EXPECT_NE(unknown.body.find("no job 'nobody'"), std::string::npos) << unknown.body;
}

TEST_F(JobViewTest, ATokenJobIsShownOnlyWhereAllowed) {
  writeJob("secret", "abc");
  auto options = watchOptions();
  options.showTokenJobs = false;
  JobWatch dlrund(options);
  EXPECT_EQ(firstReading(dlrund, "id=secret").status, 403);
  JobWatch agent(watchOptions("secret"));
  EXPECT_EQ(firstReading(agent, "").status, 200);
}

TEST(JobWatchQuery, TheIdComesFromTheQueryOrIsTheOwnJob) {
  EXPECT_EQ(jobIdFrom("", "own"), "own");
  EXPECT_EQ(jobIdFrom("x=1&id=job-1.a_b", ""), "job-1.a_b");
  EXPECT_THROW(jobIdFrom("id=a/b", ""), ConfigError);
  EXPECT_THROW(jobIdFrom("id=" + std::string(300, 'a'), ""), ConfigError);
}

}  // namespace
}  // namespace dlrun::control
