#include "launcher/host_probe.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <string_view>

#include "common/error.h"
#include "launcher/entry_point.h"
#include "store/address.h"

namespace dlrun::launcher {

namespace fs = std::filesystem;

HostProbe HostProbe::real() {
  HostProbe host;
  host.cpuCount = [] {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
    return static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  };
  host.gpuCount = [] {
    int count = 0;
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator("/dev", ec)) {
      const std::string name = entry.path().filename();
      if (name.starts_with("nvidia") && name.size() > 6 &&
          std::all_of(name.begin() + 6, name.end(), ::isdigit))
        ++count;
    }
    return count;
  };
  host.findOnPath = [](const std::string& name) -> std::optional<std::string> {
    const char* env = std::getenv("PATH");
    const std::string path = env ? env : "/usr/bin:/bin";
    size_t start = 0;
    while (true) {
      const size_t end = path.find(':', start);
      const std::string dir = path.substr(start, end - start);
      std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
      if (isExecutableFile(candidate)) return candidate;
      if (end == std::string::npos) return std::nullopt;
      start = end + 1;
    }
  };
  host.fileExists = [](const std::string& p) {
    std::error_code ec;
    return fs::is_regular_file(p, ec);
  };
  host.numaCpuSets = [](agents::NumaMode mode, int nproc) {
    const char* root = std::getenv("DLRUN_SYSFS_ROOT");
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    const agents::CpuTopology topology = agents::readCpuTopology(
        root && *root ? root : "/", visible ? std::optional<std::string>(visible) : std::nullopt);
    cpu_set_t set;
    std::vector<int> allowed;
    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
      for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu)
        if (CPU_ISSET(cpu, &set)) allowed.push_back(cpu);
    }
    return agents::numaCpuSets(topology, mode, nproc, allowed);
  };
  std::error_code ec;
  host.selfDir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  const char* python = std::getenv("PYTHON_EXEC");
  const std::string own =
      environmentPython(host.selfDir, [](const std::string& path) { return fs::exists(path); });
  host.pythonExec = python && *python ? python : !own.empty() ? own : "python3";
  for (char** entry = environ; *entry; ++entry) {
    const std::string_view text(*entry);
    const size_t eq = text.find('=');
    const std::string_view name = text.substr(0, eq);
    if (eq != std::string_view::npos &&
        (name.starts_with("SLURM") || name.starts_with("OMPI_") || name.starts_with("PMIX_") ||
         name == "DLRUN_SLURM" || name == "DLRUN_MPI" || name == "DLRUN_ETCD_ENDPOINTS" ||
         name == "DLRUN_TOKEN" || name == "MASTER_ADDR" || name == "MASTER_PORT" ||
         name == "CUDA_VISIBLE_DEVICES" || name == "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" ||
         name == "TORCHELASTIC_HEALTH_CHECK_PORT" || name == "KUBERNETES_SERVICE_HOST" ||
         name == "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"))
      host.env.emplace(text.substr(0, eq), text.substr(eq + 1));
  }
  host.resolveHost = [](const std::string& name) -> std::optional<std::string> {
    try {
      return resolveNumeric(name, "host");
    } catch (const NetworkError&) {
      return std::nullopt;
    }
  };
  return host;
}

std::string environmentPython(const std::string& selfDir,
                              const std::function<bool(const std::string&)>& exists) {
  if (selfDir.empty()) return {};
  const fs::path dir(selfDir);
  const fs::path prefix = dir.parent_path();
  if (!exists((prefix / "pyvenv.cfg").string()) && !exists((prefix / "conda-meta").string()))
    return {};
  for (const char* name : {"python3", "python"}) {
    const fs::path interpreter = dir / name;
    if (exists(interpreter.string())) return interpreter.string();
  }
  return {};
}

}  // namespace dlrun::launcher
