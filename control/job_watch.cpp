#include "control/job_watch.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/error.h"
#include "control/job_read.h"
#include "control/state/progress_record.h"
#include "control/state/stragglers.h"

namespace dlrun::control {

namespace {

using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

constexpr double kPointEvery = 10;  // seconds: a point at least this often, else on new steps
constexpr int64_t kEventBatch = 256;
constexpr auto kUnwrittenWait = std::chrono::seconds(3);  // as WatchTiming::gapWait

json orNull(const std::optional<double>& value) { return value ? json(*value) : json(nullptr); }

std::string errorJson(const std::string& message) { return json{{"error", message}}.dump(); }

metrics::HttpReply jsonReply(int status, std::string body) {
  return {.status = status, .contentType = "application/json", .body = std::move(body)};
}

bool idCharacter(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ||
         c == ':' || c == '@';
}

// Keeps the whole run at a coarser grain once full: every other point, and the newest.
void thin(std::vector<JobPoint>& curve) {
  if (curve.size() <= JobWatch::kMaxCurve) return;
  std::vector<JobPoint> kept;
  for (size_t i = 0; i < curve.size(); i += 2) kept.push_back(curve[i]);
  if (curve.size() % 2 == 0) kept.push_back(curve.back());
  curve = std::move(kept);
}

json pointJson(const JobPoint& p) {
  return json::array({p.time, p.step, orNull(p.loss), orNull(p.accuracy), orNull(p.paceMin),
                      orNull(p.paceMedian), orNull(p.paceMax), orNull(p.lossMin),
                      orNull(p.lossMedian), orNull(p.lossMax)});
}

}  // namespace

std::string jobIdFrom(std::string_view query, const std::string& own) {
  std::string id;
  bool named = false;
  while (!query.empty()) {
    const size_t end = query.find('&');
    const std::string_view pair = query.substr(0, end);
    if (pair.starts_with("id=")) {
      id = std::string(pair.substr(3));
      named = true;
    }
    if (end == std::string_view::npos) break;
    query.remove_prefix(end + 1);
  }
  if (!named) return own;
  if (id.empty() || id.size() > 256 || !std::all_of(id.begin(), id.end(), idCharacter))
    throw ConfigError("malformed job id in the request: give ?id= with the job's --rdzv-id");
  return id;
}

JobPoint jobPoint(const v1::Job& job) {
  JobPoint p{.time = job.time()};
  std::vector<double> paces, losses;
  for (const auto& node : job.nodes()) {
    if (node.replaced_by() != 0) continue;
    for (const auto& w : node.workers()) {
      if (!w.reported()) continue;
      if (w.rank() == 0) {
        p.step = w.step();
        if (w.has_loss()) p.loss = w.loss();
        if (w.has_accuracy()) p.accuracy = w.accuracy();
      }
      if (w.state() == "running" && w.steps_per_second() >= 0)
        paces.push_back(w.steps_per_second());
      if (w.has_loss()) losses.push_back(w.loss());
    }
  }
  if (!paces.empty()) {
    p.paceMin = *std::min_element(paces.begin(), paces.end());
    p.paceMax = *std::max_element(paces.begin(), paces.end());
    p.paceMedian = median(paces);
  }
  if (!losses.empty()) {
    p.lossMin = *std::min_element(losses.begin(), losses.end());
    p.lossMax = *std::max_element(losses.begin(), losses.end());
    p.lossMedian = median(losses);
  }
  return p;
}

JobWatch::JobWatch(JobWatchOptions options) : options_(std::move(options)) {
  thread_ = std::thread([this] { run(); });
}

JobWatch::~JobWatch() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    if (reading_) reading_->abort();
  }
  asked_.notify_all();
  thread_.join();
}

metrics::HttpReply JobWatch::api(std::string_view query) {
  std::string id;
  try {
    id = jobIdFrom(query, options_.ownJob);
  } catch (const ConfigError& e) {
    return jsonReply(400, errorJson(e.what()));
  }
  if (id.empty()) return jsonReply(400, errorJson("name the job: /job?id=ID (its --rdzv-id)"));
  if (!options_.ownJob.empty() && id != options_.ownJob)
    return jsonReply(
        404, errorJson("this agent serves job '" + options_.ownJob + "' only, not '" + id + "'"));
  std::string answer;
  int status;
  {
    std::lock_guard lock(mutex_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) {
      if (jobs_.size() >= kMaxJobs)
        return jsonReply(503, errorJson("too many jobs watched at once; try again in a minute"));
      it = jobs_.emplace(id, Watched{}).first;
    }
    it->second.asked = SteadyClock::now();
    answer = it->second.answer;
    status = it->second.status;
  }
  asked_.notify_all();
  if (answer.empty()) return jsonReply(202, json{{"pending", true}}.dump());
  if (status == 200 && options_.storeJson)
    answer.insert(answer.size() - 1, ",\"store\":" + options_.storeJson());
  return jsonReply(status, std::move(answer));
}

void JobWatch::run() {
  std::unique_ptr<LeasingStore> store;
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    // Jobs nobody asked for in a while are dropped; with none left, wait to be asked.
    std::erase_if(jobs_, [&](const auto& job) {
      return SteadyClock::now() - job.second.asked > options_.idle;
    });
    if (jobs_.empty()) {
      reading_ = nullptr;
      store.reset();
      asked_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      continue;
    }
    std::vector<std::string> ids;
    for (const auto& [id, job] : jobs_)
      if (SteadyClock::now() >= job.nextLook) ids.push_back(id);
    lock.unlock();
    for (const auto& id : ids) {
      try {
        if (!store) {
          store = options_.connect();
          std::lock_guard relock(mutex_);
          if (stopping_) return;
          reading_ = store.get();
        }
        look(*store, id);
      } catch (const std::exception& e) {
        std::lock_guard relock(mutex_);
        reading_ = nullptr;
        store.reset();  // a new connection next time
        if (auto it = jobs_.find(id); it != jobs_.end()) {
          it->second.status = 503;
          it->second.answer = errorJson(std::string("cannot read the job's store: ") + e.what());
        }
      }
    }
    lock.lock();
    asked_.wait_for(lock, options_.every, [&] { return stopping_; });
  }
}

// One reading of job `id`: the job, its new events; then the answer. The store is read and the
// answer built without the lock: the HTTP thread that takes the lock in api() is, in dlrund, the
// store's own, which must go on serving these very reads. Only this thread changes an entry's
// readings (the curve, the events) and erases entries, so they need no lock; the lock guards the
// map and what api() copies.
void JobWatch::look(LeasingStore& store, const std::string& id) {
  Watched* w;
  {
    std::lock_guard lock(mutex_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return;
    w = &it->second;
  }
  const auto answer = [&](int status, std::string text, SteadyClock::duration wait) {
    std::lock_guard lock(mutex_);
    w->status = status;
    w->answer = std::move(text);
    w->nextLook = SteadyClock::now() + wait;
  };
  std::optional<JobRecord> record;
  try {
    record = readJob(store, id, JobParts::WithNodes);
  } catch (const Refusal& refusal) {
    const bool unknown = refusal.status.error_code() == grpc::StatusCode::NOT_FOUND;
    return answer(unknown ? 404 : 400, errorJson(refusal.status.error_message()), options_.every);
  }
  if (!options_.showTokenJobs && !record->meta.tokenHash.empty())
    return answer(403,
                  errorJson("job '" + id +
                            "' was started with a token: its page is on its agents' "
                            "--metrics-port"),
                  options_.every);
  v1::Job job;
  fillJob(*record, unixSeconds(), job);
  const JobPoint point = jobPoint(job);
  if (w->curve.empty() || w->curve.back().step != point.step ||
      point.time - w->curve.back().time >= kPointEvery) {
    w->curve.push_back(point);
    thin(w->curve);
  }
  readEvents(store, Keys(id), *w);
  std::string text = "{\"job\":" + protoJson(job) + ",\"curve\":[";
  for (size_t i = 0; i < w->curve.size(); ++i)
    text += (i ? "," : "") + pointJson(w->curve[i]).dump();
  text += "],\"events\":[";
  for (size_t i = 0; i < w->events.size(); ++i) text += (i ? "," : "") + w->events[i];
  text += "]}";
  answer(200, std::move(text),
         std::max<SteadyClock::duration>(
             options_.every, std::chrono::duration_cast<SteadyClock::duration>(
                                 std::chrono::duration<double>(recordPeriod(job.nodes_size())))));
}

// The events after the last seen, a batch a look.
void JobWatch::readEvents(LeasingStore& store, const Keys& keys, Watched& w) {
  const int64_t count = storedCount(store.peek({keys.seq()})[0], keys.seq());
  std::vector<std::string> eventKeys;
  for (int64_t n = w.eventsSeen + 1; n <= std::min(count, w.eventsSeen + kEventBatch); ++n)
    eventKeys.push_back(keys.event(n));
  if (eventKeys.empty()) return;
  for (const std::string& text : store.peek(eventKeys)) {
    if (text.empty()) {
      // Counted, not written yet: wait for it a while (its publisher is between the two
      // requests), then go on without it (it died there).
      if (!w.unwrittenSince) w.unwrittenSince = SteadyClock::now();
      if (SteadyClock::now() - *w.unwrittenSince < kUnwrittenWait) return;
    }
    w.unwrittenSince.reset();
    ++w.eventsSeen;
    if (text.empty()) continue;
    try {
      JobEvent e = decodeEvent(text);
      e.seq = w.eventsSeen;
      w.events.push_back(protoJson(toProto(e)));
    } catch (const ProtocolError&) {
      continue;
    }
    if (w.events.size() > kMaxEvents) w.events.pop_front();
  }
}

}  // namespace dlrun::control
