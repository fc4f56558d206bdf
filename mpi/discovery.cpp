#include "mpi/discovery.h"

#include "common/error.h"
#include "common/text.h"

namespace dlrun::mpi {
namespace {

const std::string* find(const Environment& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

// The first of `names` that is set, as a whole number >= min; nullopt when none is set.
std::optional<int> firstNumber(const Environment& env, std::initializer_list<const char*> names,
                               int min, int max = 1'000'000) {
  for (const char* name : names) {
    const std::string* text = find(env, name);
    if (!text) continue;
    const auto value = parseInteger<int>(*text);
    if (!value || *value < min || *value > max)
      throw ConfigError(std::string(name) + "='" + *text + "' is not a whole number from " +
                        std::to_string(min) + " to " + std::to_string(max) +
                        "; set DLRUN_MPI=0 to ignore mpirun");
    return value;
  }
  return std::nullopt;
}

// FNV-1a: the same port on every host for one job id, whatever the id's form.
uint16_t portOf(const std::string& jobId) {
  uint32_t hash = 2166136261u;
  for (unsigned char c : jobId) hash = (hash ^ c) * 16777619u;
  return discovery::derivedPort(hash);
}

}  // namespace

bool detected(const Environment& env) {
  if (const std::string* flag = find(env, "DLRUN_MPI")) {
    if (*flag == "0") return false;
    if (*flag != "1") throw ConfigError("DLRUN_MPI='" + *flag + "' is not 0 or 1");
  }
  return find(env, "OMPI_COMM_WORLD_RANK") || find(env, "PMIX_RANK");
}

Settings discover(const Environment& env, const UserFlags& user) {
  Settings s;
  const std::string* jobId = find(env, "OMPI_MCA_ess_base_jobid");
  if (!jobId) jobId = find(env, "PMIX_NAMESPACE");
  if (!user.rdzvId && jobId) s.rdzvId = "mpi-" + *jobId;
  if (!user.nodeRank) s.nodeRank = firstNumber(env, {"OMPI_COMM_WORLD_RANK", "PMIX_RANK"}, 0);
  if (!user.nnodes) {
    s.nnodes = firstNumber(env, {"OMPI_COMM_WORLD_SIZE"}, 1);
    if (!s.nnodes)
      throw ConfigError(
          "under mpirun (PMIX_RANK is set) no variable gives the number of "
          "dlrun processes: pass --nnodes");
  }
  if (!user.rdzvEndpoint) {
    const std::string* host = find(env, "MASTER_ADDR");
    if (!host)
      throw ConfigError(
          "under mpirun the store's host is MASTER_ADDR, which is not set: run "
          "mpirun -x MASTER_ADDR=HOST, or pass --rdzv-endpoint=HOST[:PORT]");
    const auto port = firstNumber(env, {"MASTER_PORT"}, 1, 65535);
    s.endpoint = HostPort{*host, port ? static_cast<uint16_t>(*port) : portOf(jobId ? *jobId : "")};
  }
  return s;
}

}  // namespace dlrun::mpi
