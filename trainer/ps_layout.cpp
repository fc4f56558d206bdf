#include "trainer/ps_layout.h"

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace dlrun::trainer {
namespace {

size_t listSize(const nlohmann::json& cluster, const char* job) {
  if (!cluster.contains(job)) return 0;
  const auto& list = cluster.at(job);
  if (!list.is_array())
    throw ConfigError(std::string("TF_CONFIG's cluster '") + job +
                      "' is not a list of host:port entries");
  return list.size();
}

}  // namespace

PsPlace psPlaceFromTfConfig(const char* tfConfig) {
  const std::string launch =
      "; launch with roles, e.g. 'dlrun --standalone --roles ps:1,worker:2:alone train "
      "--strategy ps'";
  if (tfConfig == nullptr) throw ConfigError("--strategy ps: TF_CONFIG is not set" + launch);
  const auto config = nlohmann::json::parse(tfConfig, nullptr, /*allow_exceptions=*/false);
  if (!config.is_object() || !config.contains("cluster") || !config["cluster"].is_object() ||
      !config.contains("task") || !config["task"].is_object() || !config["task"].contains("type") ||
      !config["task"]["type"].is_string() || !config["task"].contains("index") ||
      !config["task"]["index"].is_number_integer())
    throw ConfigError("--strategy ps: TF_CONFIG is not {\"cluster\":{...},\"task\":{...}}");
  const auto& cluster = config["cluster"];
  const size_t servers = listSize(cluster, "ps");
  const size_t chiefs = listSize(cluster, "chief");
  const size_t workers = chiefs + listSize(cluster, "worker");
  if (servers == 0) throw ConfigError("--strategy ps: the job has no ps process" + launch);
  if (workers == 0) throw ConfigError("--strategy ps: the job has no worker process" + launch);
  const std::string type = config["task"]["type"];
  const int index = config["task"]["index"];
  const size_t ofType = listSize(cluster, type.c_str());
  if (index < 0 || static_cast<size_t>(index) >= ofType)
    throw ConfigError("--strategy ps: TF_CONFIG's task " + type + ":" + std::to_string(index) +
                      " is not in its cluster");
  PsPlace place{static_cast<int>(servers), static_cast<int>(workers), type == "ps", index};
  if (type == "worker")
    place.index = index + static_cast<int>(chiefs);
  else if (type != "ps" && type != "chief")
    throw ConfigError("--strategy ps: a task of type '" + type +
                      "' has no part in training (ps, chief or worker)");
  return place;
}

std::vector<ShardRange> shardRanges(size_t parameters, int servers) {
  if (servers < 1 || static_cast<size_t>(servers) > parameters)
    throw ConfigError("--strategy ps: " + std::to_string(servers) + " parameter servers for " +
                      std::to_string(parameters) +
                      " parameters; use at most one server per parameter");
  std::vector<ShardRange> ranges;
  const size_t base = parameters / servers, extra = parameters % servers;
  size_t begin = 0;
  for (int i = 0; i < servers; ++i) {
    const size_t size = base + (static_cast<size_t>(i) < extra ? 1 : 0);
    ranges.push_back({begin, begin + size});
    begin += size;
  }
  return ranges;
}

}  // namespace dlrun::trainer
