#include "agents/worker_env.h"

#include <nlohmann/json.hpp>

#include "common/error.h"

extern char** environ;

namespace dlrun::agents {
namespace {

// TF_CONFIG is {"cluster":CLUSTER,"task":{"index":RANK,"type":"worker"}}, in nlohmann's key
// order, as it was when built whole for each worker.
constexpr std::string_view kTfHead = R"({"cluster":)";
constexpr std::string_view kTfTask = R"(,"task":{"index":)";
constexpr std::string_view kTfTail = R"(,"type":"worker"}})";
constexpr std::string_view kTfKey = "TF_CONFIG=";

// The variables each worker sets for itself; everything else is shared.
bool ownKey(const std::string& key) {
  return key == "RANK" || key == "LOCAL_RANK" || key == "ROLE_RANK" ||
         key == "TORCHELASTIC_ERROR_FILE" || key == "DLRUN_HEARTBEAT_FILE";
}

}  // namespace

std::string tfConfigCluster(const rendezvous::World& world) {
  return nlohmann::json{{"worker", world.workerEndpoints}}.dump();
}

std::string tfConfig(const std::string& cluster, int rank) {
  std::string config;
  config.reserve(tfConfigLength(cluster, rank));
  config += kTfHead;
  config += cluster;
  config += kTfTask;
  config += std::to_string(rank);
  config += kTfTail;
  return config;
}

std::string tfConfig(const rendezvous::World& world, int rank) {
  return tfConfig(tfConfigCluster(world), rank);
}

size_t tfConfigLength(const std::string& cluster, int rank) {
  return kTfHead.size() + cluster.size() + kTfTask.size() + std::to_string(rank).size() +
         kTfTail.size();
}

TfConfigChoice chooseTfConfig(TfConfigMode mode, const std::string& cluster, int worldSize,
                              size_t maxString) {
  if (mode == TfConfigMode::Never) return {};
  // The last rank's is the longest, and every node decides on the same one.
  const size_t bytes = kTfKey.size() + tfConfigLength(cluster, worldSize - 1) + 1;
  if (bytes <= maxString) return {.set = true};
  const std::string why = "TF_CONFIG for " + std::to_string(worldSize) + " workers would take " +
                          std::to_string(bytes) + " bytes, over the kernel's limit of " +
                          std::to_string(maxString) + " bytes for one environment variable";
  if (mode == TfConfigMode::Always)
    throw ConfigError("--tf-config=always: " + why +
                      ", so no worker could be started with it (--tf-config=auto leaves it out)");
  return {.set = false,
          .warning = why + ", so the workers start without it (--tf-config=never leaves it out "
                           "without this warning)"};
}

NodeEnvironment::NodeEnvironment(const Environment& inherited, const rendezvous::World& world,
                                 RoundSpec spec)
    : baseRank_(world.baseRank),
      tfCluster_(std::move(spec.tfCluster)),
      heartbeatDir_(std::move(spec.heartbeatDir)) {
  Environment env = inherited;
  auto set = [&](const std::string& key, const std::string& value) { env[key] = value; };
  auto setDefault = [&](const std::string& key, const std::string& value) {
    env.try_emplace(key, value);
  };
  set("WORLD_SIZE", std::to_string(world.worldSize));
  set("LOCAL_WORLD_SIZE", std::to_string(world.localWorldSize));
  set("GROUP_RANK", std::to_string(world.groupRank));
  set("GROUP_WORLD_SIZE", std::to_string(world.groupWorldSize));
  // One role per job: role ranks are the global ranks.
  set("ROLE_NAME", spec.role);
  set("ROLE_WORLD_SIZE", std::to_string(world.worldSize));
  set("MASTER_ADDR", world.masterAddr);
  set("MASTER_PORT", std::to_string(world.masterPort));
  set("TORCHELASTIC_USE_AGENT_STORE", world.agentStore ? "True" : "False");
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(spec.restartCount));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(spec.maxRestarts));
  set("TORCHELASTIC_RUN_ID", world.runId);
  if (world.localWorldSize > 1) setDefault("OMP_NUM_THREADS", "1");
  // A failed NCCL op then ends the worker instead of hanging it, so the agent can restart.
  setDefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  setDefault("NCCL_ASYNC_ERROR_HANDLING", "1");
  if (tfCluster_ || !spec.inheritTfConfig) env.erase("TF_CONFIG");
  for (auto& [key, value] : spec.services) env[key] = std::move(value);
  shared_.reserve(env.size());
  for (const auto& [key, value] : env) {
    if (ownKey(key)) continue;
    shared_.push_back(key + "=" + value);
    sharedSizes_.add(shared_.back().size());
  }
}

std::vector<std::string> NodeEnvironment::ownSmall(int localRank,
                                                   const std::string& errorFile) const {
  const std::string rank = std::to_string(baseRank_ + localRank);
  std::vector<std::string> entries{"RANK=" + rank, "LOCAL_RANK=" + std::to_string(localRank),
                                   "ROLE_RANK=" + rank, "TORCHELASTIC_ERROR_FILE=" + errorFile};
  if (heartbeatDir_)
    entries.push_back("DLRUN_HEARTBEAT_FILE=" + heartbeatFile(*heartbeatDir_, localRank));
  return entries;
}

std::string heartbeatFile(const std::string& heartbeatDir, int localRank) {
  return heartbeatDir + "/" + std::to_string(localRank);
}

std::vector<std::string> NodeEnvironment::own(int localRank, const std::string& errorFile) const {
  std::vector<std::string> entries = ownSmall(localRank, errorFile);
  if (tfCluster_)
    entries.push_back(std::string(kTfKey) + tfConfig(*tfCluster_, baseRank_ + localRank));
  return entries;
}

ExecSizes NodeEnvironment::sizes(int localRank, const std::string& errorFile) const {
  ExecSizes sizes = sharedSizes_;
  for (const auto& entry : ownSmall(localRank, errorFile)) sizes.add(entry.size());
  if (tfCluster_) sizes.add(kTfKey.size() + tfConfigLength(*tfCluster_, baseRank_ + localRank));
  return sizes;
}

Environment NodeEnvironment::forWorker(int localRank, const std::string& errorFile) const {
  Environment env;
  auto insert = [&](const std::string& entry) {
    const size_t eq = entry.find('=');
    env.emplace(entry.substr(0, eq), entry.substr(eq + 1));
  };
  for (const auto& entry : shared_) insert(entry);
  for (const auto& entry : own(localRank, errorFile)) insert(entry);
  return env;
}

Environment workerEnvironment(const Environment& inherited, const rendezvous::World& world,
                              const WorkerSpec& spec, int localRank) {
  const NodeEnvironment node(inherited, world,
                             {.role = spec.role,
                              .maxRestarts = spec.maxRestarts,
                              .restartCount = spec.restartCount,
                              .tfCluster = tfConfigCluster(world)});
  return node.forWorker(localRank, spec.errorFile);
}

Environment currentEnvironment() {
  Environment env;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string_view item(*entry);
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) continue;
    env.emplace(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1)));
  }
  return env;
}

std::vector<std::string> toEnvp(const Environment& env) {
  std::vector<std::string> envp;
  envp.reserve(env.size());
  for (const auto& [key, value] : env) envp.push_back(key + "=" + value);
  return envp;
}

}  // namespace dlrun::agents
