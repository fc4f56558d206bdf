#include "agents/failure_summary.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "common/error.h"
#include "store/json_fields.h"

namespace dlrun::agents {

namespace {

using json_fields::field;
using nlohmann::json;

constexpr char kWhat[] = "a node's failed workers";

std::string plural(int n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

std::string where(const FailureRecord& f) {
  return "rank " + std::to_string(f.rank) + (f.node.empty() ? "" : " on " + f.node);
}

int count(const json& object, const char* name) {
  const int n = field<int>(object, name, kWhat);
  if (n < 0) throw ProtocolError(std::string(kWhat) + " has a negative '" + name + "'");
  return n;
}

FailureRecord decodeRecord(const json& j) {
  if (!j.is_object()) throw ProtocolError(std::string(kWhat) + " has a malformed failure");
  FailureRecord f{.rank = field<int>(j, "rank", kWhat),
                  .localRank = field<int>(j, "local_rank", kWhat),
                  .node = field<std::string>(j, "node", kWhat),
                  .attempt = field<int>(j, "attempt", kWhat),
                  .time = field<double>(j, "time", kWhat),
                  .exit = field<std::string>(j, "exit", kWhat),
                  .report = field<std::string>(j, "report", kWhat)};
  // Another node's encoder caps it; a garbled one still prints no more than this.
  f.report = capReport(f.report, NodeFailures::kReportBytes);
  return f;
}

// The host of "host:port" or "[v6]:port".
std::string hostOf(const std::string& endpoint) {
  const size_t colon = endpoint.rfind(':');
  std::string host = colon == std::string::npos ? endpoint : endpoint.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  return host;
}

std::string ranks(int first, int last) {
  return first == last ? "rank " + std::to_string(first)
                       : "ranks " + std::to_string(first) + "-" + std::to_string(last);
}

}  // namespace

void NodeFailures::add(FailureRecord failure) {
  if (failures.size() >= kListed) {
    ++unlisted;
    return;
  }
  // Only the earliest can be the job's first: the others' reports would only weigh on the round.
  failure.report = failures.empty() ? capReport(failure.report, kReportBytes) : "";
  failures.push_back(std::move(failure));
}

std::string NodeFailures::encode() const {
  json list = json::array();
  for (const auto& f : failures)
    list.push_back({{"rank", f.rank},
                    {"local_rank", f.localRank},
                    {"node", f.node},
                    {"attempt", f.attempt},
                    {"time", f.time},
                    {"exit", f.exit},
                    {"report", f.report}});
  return json{{"node", node},
              {"base_rank", baseRank},
              {"workers", workers},
              {"stopped", stopped},
              {"succeeded", succeeded},
              {"unlisted", unlisted},
              {"failures", std::move(list)}}
      .dump(-1, ' ', false, json::error_handler_t::replace);  // a worker's bytes need not be UTF-8
}

NodeFailures NodeFailures::decode(std::string_view text) {
  const json j = json_fields::parse(text, kWhat);
  NodeFailures out{.node = field<std::string>(j, "node", kWhat),
                   .baseRank = count(j, "base_rank"),
                   .workers = count(j, "workers"),
                   .stopped = count(j, "stopped"),
                   .succeeded = count(j, "succeeded"),
                   .unlisted = count(j, "unlisted")};
  const auto list = j.find("failures");
  if (list == j.end() || !list->is_array())
    throw ProtocolError(std::string(kWhat) + " lacks 'failures'");
  for (const auto& f : *list) {
    if (out.failures.size() >= kListed) {
      ++out.unlisted;
      continue;
    }
    out.failures.push_back(decodeRecord(f));
  }
  return out;
}

std::string capReport(const std::string& report, size_t limit) {
  if (report.size() <= limit) return report;
  const size_t firstEnd = report.find('\n');
  const std::string head = report.substr(0, std::min(firstEnd, limit / 2)) + "\n";
  const std::string cut = "dlrun:   ... (cut)\n";
  const size_t room = limit > head.size() + cut.size() ? limit - head.size() - cut.size() : 0;
  size_t from = report.size() - std::min(room, report.size());
  // From a line's start, so that every line kept is whole.
  if (const size_t nl = report.find('\n', from > 0 ? from - 1 : 0);
      from > 0 && nl != std::string::npos)
    from = nl + 1;
  return head + cut + report.substr(from);
}

FailureSummary summarize(const std::vector<NodeFailures>& nodes,
                         const std::vector<std::string>& missing) {
  std::vector<const FailureRecord*> all;
  int failed = 0, stopped = 0, succeeded = 0;
  for (const auto& n : nodes) {
    for (const auto& f : n.failures) all.push_back(&f);
    failed += n.failed();
    stopped += n.stopped;
    succeeded += n.succeeded;
  }
  FailureSummary out;
  if (all.empty()) return out;
  std::stable_sort(all.begin(), all.end(), [](const FailureRecord* a, const FailureRecord* b) {
    return a->time != b->time ? a->time < b->time : a->rank < b->rank;
  });
  const FailureRecord& first = *all.front();
  out.any = true;
  const int others = failed - 1;
  out.firstLine = "the job failed: " + where(first) + " failed first (attempt " +
                  std::to_string(first.attempt) + ", " + first.exit + "); " +
                  (others == 0 ? std::string("no other rank failed")
                               : plural(others, "other rank", "other ranks") + " failed after it");
  if (stopped > 0) out.firstLine += ", " + plural(stopped, "was", "were") + " stopped by dlrun";
  if (succeeded > 0) out.firstLine += ", " + plural(succeeded, "had", "had") + " exited 0";
  std::string text = "dlrun: " + out.firstLine + "\n";
  // formatFailureReport's first line where the report is lost (a garbled list, say).
  text += !first.report.empty() ? first.report
                                : "dlrun: worker failed: rank " + std::to_string(first.rank) +
                                      " (local rank " + std::to_string(first.localRank) + ")" +
                                      (first.node.empty() ? "" : " on " + first.node) +
                                      " ended with " + first.exit + "\n";
  if (text.back() != '\n') text += '\n';
  size_t shown = 0;
  for (size_t i = 1; i < all.size() && shown < kOthersShown; ++i, ++shown) {
    const FailureRecord& f = *all[i];
    char after[48];
    std::snprintf(after, sizeof after, "+%.2f s", f.time - first.time);
    text += "dlrun:   then " + where(f) + " (attempt " + std::to_string(f.attempt) +
            "): " + f.exit + ", " + after + "\n";
  }
  if (const int more = others - static_cast<int>(shown); more > 0)
    text += "dlrun:   ... and " + std::to_string(more) + " more\n";
  for (const auto& node : missing) text += "dlrun: node " + node + " did not report its workers\n";
  out.text = std::move(text);
  return out;
}

std::vector<std::string> unreported(const std::vector<NodeFailures>& reported,
                                    const std::vector<std::string>& workerEndpoints) {
  const int size = static_cast<int>(workerEndpoints.size());
  std::vector<bool> covered(workerEndpoints.size(), false);
  for (const auto& n : reported)
    for (int r = std::max(0, n.baseRank); r < std::min(size, n.baseRank + n.workers); ++r)
      covered[static_cast<size_t>(r)] = true;
  // Each host's uncovered ranks, hosts in the order of their first such rank.
  std::vector<std::string> hosts;
  std::map<std::string, std::vector<std::pair<int, int>>> spans;
  for (int r = 0; r < size; ++r) {
    if (covered[static_cast<size_t>(r)]) continue;
    const std::string host = hostOf(workerEndpoints[static_cast<size_t>(r)]);
    auto& list = spans[host];
    if (list.empty()) hosts.push_back(host);
    if (!list.empty() && list.back().second == r - 1)
      list.back().second = r;
    else
      list.emplace_back(r, r);
  }
  std::vector<std::string> out;
  for (const auto& host : hosts) {
    std::string text;
    for (const auto& [a, b] : spans[host]) text += (text.empty() ? "" : ", ") + ranks(a, b);
    out.push_back(host + " (" + text + ")");
  }
  return out;
}

std::string reportPreface(const std::string& report) {
  const size_t at = report.find("dlrun: worker failed:");
  if (at == std::string::npos || at == 0 || report[at - 1] != '\n') return {};
  return report.substr(0, at);
}

}  // namespace dlrun::agents
