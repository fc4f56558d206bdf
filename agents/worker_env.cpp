#include "agents/worker_env.h"

#include <nlohmann/json.hpp>

extern char** environ;

namespace dlrun::agents {

std::string tfConfig(const rendezvous::World& world, int rank) {
  nlohmann::json config = {
      {"cluster", {{"worker", world.workerEndpoints}}},
      {"task", {{"type", "worker"}, {"index", rank}}},
  };
  return config.dump();
}

Environment workerEnvironment(const Environment& inherited, const rendezvous::World& world,
                              const WorkerSpec& spec, int localRank) {
  Environment env = inherited;
  const int rank = world.baseRank + localRank;
  auto set = [&](const std::string& key, const std::string& value) { env[key] = value; };
  auto setDefault = [&](const std::string& key, const std::string& value) {
    env.try_emplace(key, value);
  };
  set("RANK", std::to_string(rank));
  set("LOCAL_RANK", std::to_string(localRank));
  set("WORLD_SIZE", std::to_string(world.worldSize));
  set("LOCAL_WORLD_SIZE", std::to_string(world.localWorldSize));
  set("GROUP_RANK", std::to_string(world.groupRank));
  set("GROUP_WORLD_SIZE", std::to_string(world.groupWorldSize));
  // One role per job: role ranks are the global ranks.
  set("ROLE_NAME", spec.role);
  set("ROLE_RANK", std::to_string(rank));
  set("ROLE_WORLD_SIZE", std::to_string(world.worldSize));
  set("MASTER_ADDR", world.masterAddr);
  set("MASTER_PORT", std::to_string(world.masterPort));
  set("TORCHELASTIC_USE_AGENT_STORE", world.agentStore ? "True" : "False");
  set("TORCHELASTIC_RESTART_COUNT", std::to_string(spec.restartCount));
  set("TORCHELASTIC_MAX_RESTARTS", std::to_string(spec.maxRestarts));
  set("TORCHELASTIC_RUN_ID", world.runId);
  set("TORCHELASTIC_ERROR_FILE", spec.errorFile);
  set("TF_CONFIG", tfConfig(world, rank));
  if (world.localWorldSize > 1) setDefault("OMP_NUM_THREADS", "1");
  // A failed NCCL op then ends the worker instead of hanging it, so the agent can restart.
  setDefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  setDefault("NCCL_ASYNC_ERROR_HANDLING", "1");
  return env;
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
