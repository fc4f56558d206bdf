// The job's one page, its data (ARCHITECTURE.md section 10): what /api/job answers on an agent's
// --metrics-port (its own job) and on dlrund's (any job without a token, by ?id=). A watch
// reads the job from its store once a second (less often for a job of more than 200 agents,
// whose records come less often) while someone looks (job_read.h: every node, rank,
// pace and straggler), keeps the job's curves since it began (rank 0's loss and accuracy, the
// spread of pace and loss across ranks) and its last events, and hands the page the newest as
// JSON. Nobody looking for a minute: it stops reading.
//
// Threads: one of its own, since it blocks on the store while the HTTP server's io_context (the
// store's own, in dlrund) must not; a request only takes the newest answer under a mutex.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "control/state/control_state.h"
#include "dlrun/v1/control.pb.h"
#include "metrics/http_server.h"
#include "store/leasing_store.h"

namespace dlrun::control {

struct JobWatchOptions {
  // Opens a connection to the store that holds the jobs' keys.
  std::function<std::unique_ptr<LeasingStore>()> connect;
  // An agent's page shows its own job: a request without ?id= means it, another id is unknown.
  std::string ownJob;
  // dlrund's page shows no job started with a token (its agents' pages do: they are the job's).
  bool showTokenJobs = true;
  // The store's own figures (JSON), read on the HTTP server's thread; empty: none.
  std::function<std::string()> storeJson;
  std::chrono::milliseconds every{1'000};
  std::chrono::milliseconds idle{60'000};
};

// One point of the job's curves (any field may be missing: JSON null).
struct JobPoint {
  double time = 0;
  int64_t step = -1;                     // rank 0's
  std::optional<double> loss, accuracy;  // rank 0's
  std::optional<double> paceMin, paceMedian, paceMax;
  std::optional<double> lossMin, lossMedian, lossMax;
};

class JobWatch {
 public:
  static constexpr size_t kMaxCurve = 1000;  // then every other point goes
  static constexpr size_t kMaxEvents = 200;
  static constexpr size_t kMaxJobs = 16;  // watched at once (dlrund serves many)

  explicit JobWatch(JobWatchOptions options);
  ~JobWatch();
  JobWatch(const JobWatch&) = delete;
  JobWatch& operator=(const JobWatch&) = delete;

  // GET /api/job?QUERY, on the HTTP server's thread: never blocks on the store.
  metrics::HttpReply api(std::string_view query);

 private:
  struct Watched {
    // Under mutex_: when api() last asked, the newest answer, when the thread reads again.
    std::chrono::steady_clock::time_point asked;
    std::string answer;  // the newest JSON, empty before the first read
    int status = 200;
    // Not before: a large job's agents write their pace less often than every second
    // (recordPeriod), and reading the whole job costs its store in proportion to its size.
    std::chrono::steady_clock::time_point nextLook{};
    // The thread's alone (it also erases entries): the readings so far.
    std::vector<JobPoint> curve;
    std::deque<std::string> events;  // JSON, oldest first
    int64_t eventsSeen = 0;
    // Since when the next event was counted but not written (its publisher numbers it, then
    // writes it): waited for a while, as WatchEvents does, then passed over.
    std::optional<std::chrono::steady_clock::time_point> unwrittenSince;
  };
  void run();
  void look(LeasingStore& store, const std::string& id);
  void readEvents(LeasingStore& store, const Keys& keys, Watched& watched);

  const JobWatchOptions options_;
  std::mutex mutex_;
  std::condition_variable asked_;
  std::map<std::string, Watched> jobs_;
  bool stopping_ = false;
  LeasingStore* reading_ = nullptr;  // the thread's connection, aborted to stop it mid-request
  std::thread thread_;
};

// The job id a query names (?id=ID), or `own` when it names none. Throws ConfigError for one that
// is malformed (URL-escaped bytes, characters no job id has).
std::string jobIdFrom(std::string_view query, const std::string& own);

// A point from one reading of the job (pure).
JobPoint jobPoint(const dlrun::v1::Job& job);

}  // namespace dlrun::control
