#include "slurm/discovery.h"

#include "common/error.h"
#include "common/text.h"
#include "slurm/hostlist.h"

namespace dlrun::slurm {
namespace {

const std::string* find(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() ? nullptr : &it->second;
}

template <typename T>
std::optional<T> number(const Environment& env, const std::string& name, T min) {
  const std::string* text = find(env, name);
  if (!text) return std::nullopt;
  const std::optional<T> value = parseInteger<T>(*text);
  if (!value || *value < min)
    throw ConfigError(name + "='" + *text + "' is not a whole number >= " + std::to_string(min) +
                      "; pass --no-slurm to ignore Slurm");
  return value;
}

std::optional<int> count(const Environment& env, const std::string& name, int min = 0) {
  return number<int>(env, name, min);
}

// srun --resv-ports: the ports Slurm reserved for this step (MpiParams=ports=), the same on
// every node of it, as "12000-12003" or "12000,12002": the store takes the first, which no other
// step's store can hold.
uint16_t firstReservedPort(const std::string& ports) {
  const std::string first = ports.substr(0, ports.find_first_of("-,"));
  const auto port = parseInteger<int>(first);
  if (!port || *port < 1 || *port > 65535)
    throw ConfigError("SLURM_STEP_RESV_PORTS='" + ports +
                      "' does not begin with a port; pass --rdzv-endpoint=HOST:PORT");
  return static_cast<uint16_t>(*port);
}

// The first variable of `names` that is set, as a count.
std::optional<int> firstCount(const Environment& env, std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (auto value = count(env, name, 1)) return value;
  return std::nullopt;
}

// --nproc-per-node=auto in an allocation: what Slurm gave this node, most specific first.
std::optional<int> workersPerNode(const Environment& env) {
  if (auto gpus = count(env, "SLURM_GPUS_ON_NODE"); gpus && *gpus > 0) return gpus;
  if (auto tasks = count(env, "SLURM_NTASKS_PER_NODE"); tasks && *tasks > 1) return tasks;
  if (auto cpus = count(env, "SLURM_CPUS_ON_NODE"); cpus && *cpus > 0) return cpus;
  return std::nullopt;
}

}  // namespace

bool detected(const Environment& env) {
  if (const std::string* flag = find(env, "DLRUN_SLURM")) {
    if (*flag == "0") return false;
    if (*flag != "1") throw ConfigError("DLRUN_SLURM='" + *flag + "' is not 0 or 1");
  }
  return find(env, "SLURM_JOB_ID") != nullptr;
}

Settings discover(const Environment& env, const UserFlags& user) {
  const auto jobId = number<uint64_t>(env, "SLURM_JOB_ID", 0);
  if (!jobId) throw ConfigError("not inside a Slurm allocation: SLURM_JOB_ID is not set");
  Settings s{.refuseLostNodes = true};
  if (!user.rdzvId) s.rdzvId = std::to_string(*jobId);
  if (const std::string* name = find(env, "SLURMD_NODENAME"); name && !name->empty())
    s.nodeName = *name;
  s.requeues = count(env, "SLURM_RESTART_COUNT").value_or(0);  // any Slurm job may be requeued
  const auto nodeId = count(env, "SLURM_NODEID");
  if (!user.nodeRank) s.nodeRank = nodeId;
  if (user.nprocAuto) s.nprocPerNode = workersPerNode(env);

  if (!user.nnodes) {
    s.nnodes = firstCount(env, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"});
    // A batch script (or salloc's shell) runs on one node only: the others would never come.
    if (s.nnodes && *s.nnodes > 1 && !find(env, "SLURM_STEP_ID"))
      throw ConfigError("this Slurm job has " + std::to_string(*s.nnodes) +
                        " nodes but dlrun runs outside a job step (SLURM_STEP_ID is unset): "
                        "start one dlrun per node with srun --ntasks-per-node=1, or pass "
                        "--nnodes");
  }

  if (!user.rdzvEndpoint) {
    const char* variable = "SLURM_STEP_NODELIST";
    const std::string* list = find(env, variable);
    if (!list) list = find(env, variable = "SLURM_JOB_NODELIST");
    if (!list)
      throw ConfigError(
          "neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set: pass "
          "--rdzv-endpoint=HOST[:PORT]");
    s.nodes = expandHostlist(*list, variable);
    const std::vector<std::string>& nodes = s.nodes;
    const std::string* reserved = find(env, "SLURM_STEP_RESV_PORTS");
    s.endpoint = HostPort{nodes.front(),
                          reserved ? firstReservedPort(*reserved) : discovery::derivedPort(*jobId)};
    if (s.nodeName)
      s.servesStore = *s.nodeName == nodes.front();
    else if (nodeId)
      s.servesStore = *nodeId == 0;
  }
  return s;
}

}  // namespace dlrun::slurm
