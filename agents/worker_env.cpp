#include "agents/worker_env.h"

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/host_port.h"
#include "common/text.h"

extern char** environ;

namespace dlrun::agents {
namespace {

// TF_CONFIG is {"cluster":CLUSTER,"task":{"index":RANK,"type":"worker"}}, in nlohmann's key
// order, as it was when built whole for each worker.
constexpr std::string_view kTfHead = R"({"cluster":)";
constexpr std::string_view kTfTask = R"(,"task":{"index":)";
constexpr std::string_view kTfType = R"(,"type":")";
constexpr std::string_view kTfTail = R"("}})";
constexpr std::string_view kTfKey = "TF_CONFIG=";

// The variables each worker sets for itself; everything else is shared. Under --roles the
// role's name and size differ from worker to worker too, and under --virtual-local-rank its
// device.
bool ownKey(const std::string& key, bool roles, bool virtualLocalRank) {
  return key == "RANK" || key == "LOCAL_RANK" || key == "ROLE_RANK" ||
         key == "TORCHELASTIC_ERROR_FILE" || key == "DLRUN_HEARTBEAT_FILE" ||
         (roles && (key == "ROLE_NAME" || key == "ROLE_WORLD_SIZE")) ||
         (virtualLocalRank && key == "CUDA_VISIBLE_DEVICES");
}

// CUDA_VISIBLE_DEVICES's entries, each without surrounding spaces.
std::vector<std::string> splitDevices(std::string_view list) {
  std::vector<std::string> devices = split(list, ',');
  for (std::string& device : devices) {
    device.erase(0, device.find_first_not_of(' '));
    device.erase(device.find_last_not_of(' ') + 1);
  }
  return devices;
}

}  // namespace

std::string tfConfigCluster(const rendezvous::World& world) {
  if (!world.workerRoles.empty()) return tfClusterOfRoles(world.workerEndpoints, world.workerRoles);
  return nlohmann::json{{"worker", world.workerEndpoints}}.dump();
}

std::string tfConfig(const std::string& cluster, int index, std::string_view type) {
  std::string config;
  config.reserve(tfConfigLength(cluster, index, type));
  config += kTfHead;
  config += cluster;
  config += kTfTask;
  config += std::to_string(index);
  config += kTfType;
  config += type;
  config += kTfTail;
  return config;
}

std::string tfConfig(const rendezvous::World& world, int rank) {
  if (world.workerRoles.empty()) return tfConfig(tfConfigCluster(world), rank);
  const RolePlace place = placeRoles(world.workerRoles, rank, 1).front();
  return tfConfig(tfConfigCluster(world), place.tfIndex, place.tfType);
}

size_t tfConfigLength(const std::string& cluster, int index, std::string_view type) {
  return kTfHead.size() + cluster.size() + kTfTask.size() + std::to_string(index).size() +
         kTfType.size() + type.size() + kTfTail.size();
}

TfConfigChoice chooseTfConfig(TfConfigMode mode, const std::string& cluster, int worldSize,
                              size_t maxString, std::string_view longestType) {
  if (mode == TfConfigMode::Never) return {};
  // The last rank's is the longest (an index no larger, with roles), and every node decides on
  // the same one.
  const size_t bytes = kTfKey.size() + tfConfigLength(cluster, worldSize - 1, longestType) + 1;
  if (bytes <= maxString) return {.set = true};
  const std::string why = "TF_CONFIG for " + std::to_string(worldSize) + " workers would take " +
                          std::to_string(bytes) + " bytes, over the kernel's limit of " +
                          std::to_string(maxString) + " bytes for one environment variable";
  if (mode == TfConfigMode::Always)
    throw ConfigError("--tf-config=always: " + why +
                      ", so no worker could be started with it (--tf-config=auto leaves it out)");
  return {.set = false,
          .warning = why +
                     ", so the workers start without it (--tf-config=never leaves it out "
                     "without this warning)"};
}

NodeEnvironment::NodeEnvironment(const Environment& inherited, const rendezvous::World& world,
                                 RoundSpec spec)
    : baseRank_(world.baseRank),
      places_(world.workerRoles.empty()
                  ? std::vector<RolePlace>{}
                  : placeRoles(world.workerRoles, world.baseRank, world.localWorldSize)),
      tfCluster_(std::move(spec.tfCluster)),
      heartbeatDir_(std::move(spec.heartbeatDir)),
      virtualLocalRank_(spec.virtualLocalRank) {
  if (const auto visible = inherited.find("CUDA_VISIBLE_DEVICES");
      virtualLocalRank_ && visible != inherited.end()) {
    checkVirtualLocalRank(world.localWorldSize, visible->second);
    devices_ = splitDevices(visible->second);
  }
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
  // Rank 0's own store (serveStoreAtRankZero) is torch's classic one unless the user chose.
  if (!world.agentStore) setDefault("USE_LIBUV", "0");
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(spec.restartCount));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(world.restarts.maxRestarts));
  set("TORCHELASTIC_RUN_ID", world.runId);
  if (world.localWorldSize > 1) setDefault("OMP_NUM_THREADS", "1");
  // A failed NCCL op then ends the worker instead of hanging it, so the agent can restart.
  setDefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  setDefault("NCCL_ASYNC_ERROR_HANDLING", "1");
  if (tfCluster_ || !spec.inheritTfConfig) env.erase("TF_CONFIG");
  for (auto& [key, value] : spec.services) env[key] = std::move(value);
  shared_.reserve(env.size());
  for (const auto& [key, value] : env) {
    if (ownKey(key, !places_.empty(), virtualLocalRank_)) continue;
    shared_.push_back(key + "=" + value);
    sharedSizes_.add(shared_.back().size());
  }
}

std::vector<std::string> NodeEnvironment::ownSmall(int localRank,
                                                   const std::string& errorFile) const {
  const std::string rank = std::to_string(baseRank_ + localRank);
  std::vector<std::string> entries{
      "RANK=" + rank, "LOCAL_RANK=" + std::to_string(virtualLocalRank_ ? 0 : localRank),
      "TORCHELASTIC_ERROR_FILE=" + errorFile};
  if (virtualLocalRank_)
    entries.push_back("CUDA_VISIBLE_DEVICES=" +
                      (devices_.empty() ? std::to_string(localRank) : devices_.at(localRank)));
  if (places_.empty()) {
    entries.push_back("ROLE_RANK=" + rank);
  } else {
    const RolePlace& place = places_.at(localRank);
    entries.push_back("ROLE_NAME=" + place.name);
    entries.push_back("ROLE_RANK=" + std::to_string(place.rank));
    entries.push_back("ROLE_WORLD_SIZE=" + std::to_string(place.worldSize));
  }
  if (heartbeatDir_)
    entries.push_back("DLRUN_HEARTBEAT_FILE=" + heartbeatFile(*heartbeatDir_, localRank));
  return entries;
}

void checkVirtualLocalRank(int workers, const std::optional<std::string>& visible) {
  if (!visible) return;
  const size_t devices = splitDevices(*visible).size();
  if (static_cast<size_t>(workers) > devices)
    throw ConfigError("--virtual-local-rank gives each of " + std::to_string(workers) +
                      " workers a device of its own, but CUDA_VISIBLE_DEVICES='" + *visible +
                      "' names " + std::to_string(devices));
}

std::string heartbeatFile(const std::string& heartbeatDir, int localRank) {
  return heartbeatDir + "/" + std::to_string(localRank);
}

std::vector<std::string> NodeEnvironment::own(int localRank, const std::string& errorFile) const {
  std::vector<std::string> entries = ownSmall(localRank, errorFile);
  if (tfCluster_) {
    const auto [type, index] = tfTask(localRank);
    entries.push_back(std::string(kTfKey) + tfConfig(*tfCluster_, index, type));
  }
  return entries;
}

std::pair<std::string_view, int> NodeEnvironment::tfTask(int localRank) const {
  if (places_.empty()) return {"worker", baseRank_ + localRank};
  const RolePlace& place = places_.at(localRank);
  return {place.tfType, place.tfIndex};
}

ExecSizes NodeEnvironment::sizes(int localRank, const std::string& errorFile) const {
  ExecSizes sizes = sharedSizes_;
  for (const auto& entry : ownSmall(localRank, errorFile)) sizes.add(entry.size());
  if (tfCluster_) {
    const auto [type, index] = tfTask(localRank);
    sizes.add(kTfKey.size() + tfConfigLength(*tfCluster_, index, type));
  }
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
  const NodeEnvironment node(
      inherited, world,
      {.role = spec.role, .restartCount = spec.restartCount, .tfCluster = tfConfigCluster(world)});
  return node.forWorker(localRank, spec.errorFile);
}

void serveStoreAtRankZero(rendezvous::World& world) {
  if (world.workerEndpoints.empty()) return;
  const HostPort rankZero = parseHostPort(world.workerEndpoints.front(), 0);
  world.agentStore = false;
  world.masterAddr = rankZero.host;
  world.masterPort = rankZero.port;
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
