#include "agents/numa_binding.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <system_error>
#include <utility>

#include "common/error.h"
#include "common/text.h"

namespace dlrun::agents {
namespace {

using Cpu = CpuTopology::Cpu;

// Above any kernel's NR_CPUS: a bigger number is a bad list, not a reason to fill memory.
constexpr int kMaxCpuId = 1 << 20;

std::string_view trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\n");
  if (first == std::string_view::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t\n") - first + 1);
}

std::optional<std::vector<int>> tryParseCpuList(std::string_view text) {
  std::vector<int> cpus;
  text = trim(text);
  if (text.empty()) return cpus;
  for (const std::string& entry : split(text, ',')) {
    const auto dash = entry.find('-');
    const auto first = parseInteger<int>(std::string_view(entry).substr(0, dash));
    const auto last = dash == std::string::npos
                          ? first
                          : parseInteger<int>(std::string_view(entry).substr(dash + 1));
    if (!first || !last || *first < 0 || *first > *last || *last > kMaxCpuId) return std::nullopt;
    for (int cpu = *first; cpu <= *last; ++cpu) cpus.push_back(cpu);
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

}  // namespace

std::optional<NumaMode> parseNumaMode(std::string_view text) {
  if (text == "node") return NumaMode::Node;
  if (text == "socket") return NumaMode::Socket;
  if (text == "exclusive") return NumaMode::Exclusive;
  if (text == "core-complex") return NumaMode::CoreComplex;
  return std::nullopt;
}

std::vector<int> parseCpuList(std::string_view text) {
  auto cpus = tryParseCpuList(text);
  if (!cpus)
    throw ConfigError("--numa-binding: \"" + std::string(trim(text)) +
                      "\" is not a CPU list such as 0-3,8,10-11");
  return std::move(*cpus);
}

std::string cpuListText(const std::vector<int>& cpus) {
  std::vector<int> sorted = cpus;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  std::string text;
  for (size_t i = 0; i < sorted.size();) {
    size_t last = i;
    while (last + 1 < sorted.size() && sorted[last + 1] == sorted[last] + 1) ++last;
    if (!text.empty()) text += ',';
    text += std::to_string(sorted[i]);
    if (last > i) text += '-' + std::to_string(sorted[last]);
    i = last + 1;
  }
  return text;
}

// ---- Reading sysfs --------------------------------------------------------------------------

namespace {

namespace fs = std::filesystem;

[[noreturn]] void badFile(const fs::path& file, std::string_view text, std::string_view want) {
  throw ConfigError("--numa-binding: " + file.string() + " holds \"" + std::string(trim(text)) +
                    "\", not " + std::string(want));
}

std::string readText(const fs::path& file) {
  std::ifstream in(file);
  if (!in)
    throw ConfigError("--numa-binding: cannot read " + file.string() + ": " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

int readInt(const fs::path& file) {
  const std::string text = readText(file);
  const auto value = parseInteger<int>(trim(text));
  if (!value) badFile(file, text, "an integer");
  return *value;
}

std::vector<int> readCpuList(const fs::path& file) {
  const std::string text = readText(file);
  auto cpus = tryParseCpuList(text);
  if (!cpus) badFile(file, text, "a CPU list");
  return std::move(*cpus);
}

// The entries of `dir`; none where it does not exist.
std::vector<fs::path> listDir(const fs::path& dir) {
  std::vector<fs::path> entries;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    entries.push_back(it->path());
  if (ec && ec != std::errc::no_such_file_or_directory)
    throw ConfigError("--numa-binding: cannot list " + dir.string() + ": " + ec.message());
  return entries;
}

// The entries `prefix`N of `dir` (node0, index3), by N.
std::vector<std::pair<int, fs::path>> numberedEntries(const fs::path& dir,
                                                      std::string_view prefix) {
  std::vector<std::pair<int, fs::path>> numbered;
  for (const fs::path& entry : listDir(dir)) {
    const std::string name = entry.filename().string();
    if (!name.starts_with(prefix)) continue;
    const auto number = parseInteger<int>(std::string_view(name).substr(prefix.size()));
    if (number && *number >= 0) numbered.emplace_back(*number, entry);
  }
  std::sort(numbered.begin(), numbered.end());
  return numbered;
}

// The CPUs sharing the first cache of the highest level among the unified and data ones, as
// torch picks it; torch goes by directory order among caches of one level, this by index.
std::vector<int> highestCacheSharing(const fs::path& cacheDir) {
  int maxLevel = -1;
  std::vector<int> sharing;
  for (const auto& [number, index] : numberedEntries(cacheDir, "index")) {
    const std::string type = readText(index / "type");
    if (trim(type) != "Unified" && trim(type) != "Data") continue;
    const int level = readInt(index / "level");
    if (level <= maxLevel) continue;
    maxLevel = level;
    sharing = readCpuList(index / "shared_cpu_list");
  }
  return sharing;
}

Cpu readCpu(const fs::path& root, int id, int node) {
  const fs::path dir = root / "sys/devices/system/cpu" / ("cpu" + std::to_string(id));
  return Cpu{id, node, readInt(dir / "topology/physical_package_id"),
             readCpuList(dir / "topology/thread_siblings_list"),
             highestCacheSharing(dir / "cache")};
}

std::vector<Cpu> readCpus(const fs::path& root) {
  const std::vector<int> online = readCpuList(root / "sys/devices/system/cpu/online");
  auto nodes = numberedEntries(root / "sys/devices/system/node", "node");
  std::vector<std::pair<int, std::vector<int>>> nodeCpus;
  for (const auto& [node, dir] : nodes) nodeCpus.emplace_back(node, readCpuList(dir / "cpulist"));
  // A kernel without NUMA shows no nodes: one node holds every CPU, as numactl sees it.
  if (nodes.empty()) nodeCpus.emplace_back(0, online);
  std::vector<Cpu> cpus;
  for (const auto& [node, ids] : nodeCpus)
    for (int id : ids)
      if (std::binary_search(online.begin(), online.end(), id))
        cpus.push_back(readCpu(root, id, node));
  std::sort(cpus.begin(), cpus.end(), [](const Cpu& a, const Cpu& b) { return a.id < b.id; });
  return cpus;
}

// The NUMA node of each NVIDIA display or 3D controller, by PCI address: the order of CUDA's
// indices where CUDA_DEVICE_ORDER=PCI_BUS_ID, and of its default order on machines of one GPU
// model. A kernel without NUMA has no numa_node file: node 0, as for -1 ("unknown").
std::vector<int> pciGpuNodes(const fs::path& root) {
  std::vector<std::pair<std::string, int>> gpus;
  for (const fs::path& device : listDir(root / "sys/bus/pci/devices")) {
    if (trim(readText(device / "vendor")) != "0x10de") continue;
    const std::string pciClass{trim(readText(device / "class"))};
    if (!pciClass.starts_with("0x0300") && !pciClass.starts_with("0x0302")) continue;
    const fs::path numaNode = device / "numa_node";
    const int node = fs::exists(numaNode) ? std::max(readInt(numaNode), 0) : 0;
    gpus.emplace_back(device.filename().string(), node);
  }
  std::sort(gpus.begin(), gpus.end());
  std::vector<int> nodes;
  for (const auto& gpu : gpus) nodes.push_back(gpu.second);
  return nodes;
}

// CUDA_VISIBLE_DEVICES as CUDA reads it: the listed indices in order, up to the first one out of
// range, repeated or empty, which hides itself and the rest ("-1" hides every GPU).
std::vector<int> visibleGpuNodes(const std::vector<int>& pciNodes, const std::string& visible) {
  std::vector<int> nodes;
  std::vector<bool> taken(pciNodes.size());
  for (const std::string& entry : split(visible, ',')) {
    const auto index = parseInteger<int>(entry);
    if (!index && !entry.empty())
      throw ConfigError(
          "--numa-binding: CUDA_VISIBLE_DEVICES must list GPU indices such as 0,1 "
          "to find each GPU's NUMA node, not \"" +
          entry + "\"");
    if (!index || *index < 0 || static_cast<size_t>(*index) >= pciNodes.size() || taken[*index])
      break;
    taken[*index] = true;
    nodes.push_back(pciNodes[*index]);
  }
  return nodes;
}

}  // namespace

CpuTopology readCpuTopology(const std::filesystem::path& root,
                            const std::optional<std::string>& visibleDevices) {
  CpuTopology topology;
  topology.gpuNodes = pciGpuNodes(root);
  if (visibleDevices) topology.gpuNodes = visibleGpuNodes(topology.gpuNodes, *visibleDevices);
  topology.cpus = readCpus(root);
  return topology;
}

// ---- The binding (pure) ---------------------------------------------------------------------

namespace {

const char* modeName(NumaMode mode) {
  switch (mode) {
    case NumaMode::Node: return "node";
    case NumaMode::Socket: return "socket";
    case NumaMode::Exclusive: return "exclusive";
    case NumaMode::CoreComplex: return "core-complex";
  }
  return "?";
}

// Where the workers are: `units` holds the NUMA node of each GPU (every visible one: torch
// shares a node among all its GPUs, used or not) or, without GPUs, of each worker.
struct Placement {
  std::map<int, std::vector<const Cpu*>> allowedByNode;  // each node's allowed CPUs, by id
  std::vector<int> units;
  std::string unitName;  // "GPUs" or "workers"

  const std::vector<const Cpu*>& cpusOf(int node) const {
    static const std::vector<const Cpu*> none;
    const auto found = allowedByNode.find(node);
    return found == allowedByNode.end() ? none : found->second;
  }
  // Unit i's place among the units of its node, by index, and their number.
  std::pair<int, int> rankOnNode(int i) const {
    const auto begin = units.begin();
    return {static_cast<int>(std::count(begin, begin + i, units[i])),
            static_cast<int>(std::count(begin, units.end(), units[i]))};
  }
};

std::vector<int> ids(const std::vector<const Cpu*>& cpus) {
  std::vector<int> out;
  for (const Cpu* cpu : cpus) out.push_back(cpu->id);
  return out;
}

// Torch names a core or a cache by its lowest CPU, allowed or not.
int groupKey(const std::vector<int>& members, int self) {
  return members.empty() ? self : *std::min_element(members.begin(), members.end());
}

// Every allowed CPU of the nodes whose socket is the node's: a node's socket is that of its
// lowest allowed CPU, as in torch.
std::vector<int> socketCpus(const Placement& placement, int node) {
  const auto& own = placement.cpusOf(node);
  if (own.empty()) return {};
  std::vector<int> cpus;
  for (const auto& [other, members] : placement.allowedByNode)
    if (members.front()->socket == own.front()->socket)
      for (const Cpu* cpu : members) cpus.push_back(cpu->id);
  std::sort(cpus.begin(), cpus.end());
  return cpus;
}

// The node's physical cores split in order among its units, the lower ones taking the remainder.
std::vector<int> exclusiveCpus(const Placement& placement, int i) {
  const int node = placement.units[i];
  const auto [place, peers] = placement.rankOnNode(i);
  std::map<int, std::vector<int>> cores;
  for (const Cpu* cpu : placement.cpusOf(node))
    cores[groupKey(cpu->siblings, cpu->id)].push_back(cpu->id);
  const int perUnit = static_cast<int>(cores.size()) / peers;
  const int extra = static_cast<int>(cores.size()) % peers;
  if (perUnit < 1)
    throw ConfigError("--numa-binding: exclusive gives each a physical core, but NUMA node " +
                      std::to_string(node) + " has " + std::to_string(cores.size()) +
                      " allowed physical cores for " + std::to_string(peers) + " " +
                      placement.unitName + "; use --numa-binding=node");
  const int start = place * perUnit + std::min(place, extra);
  const int end = start + perUnit + (place < extra ? 1 : 0);
  std::vector<int> cpus;
  auto core = std::next(cores.begin(), start);
  for (int c = start; c < end; ++c, ++core)
    cpus.insert(cpus.end(), core->second.begin(), core->second.end());
  std::sort(cpus.begin(), cpus.end());
  return cpus;
}

// One cache complex of the node, the largest (then lowest) first, dealt round the node's units.
std::vector<int> complexCpus(const Placement& placement, int i) {
  std::map<int, std::vector<int>> byCache;
  for (const Cpu* cpu : placement.cpusOf(placement.units[i])) {
    if (cpu->complex.empty())
      throw ConfigError("--numa-binding: core-complex needs the caches of CPU " +
                        std::to_string(cpu->id) + ", which sysfs does not show; use " +
                        "--numa-binding=node");
    byCache[groupKey(cpu->complex, cpu->id)].push_back(cpu->id);
  }
  if (byCache.empty()) return {};
  std::vector<std::pair<int, std::vector<int>>> complexes(byCache.begin(), byCache.end());
  std::stable_sort(complexes.begin(), complexes.end(),
                   [](const auto& a, const auto& b) { return a.second.size() > b.second.size(); });
  return complexes[placement.rankOnNode(i).first % complexes.size()].second;
}

Placement place(const CpuTopology& topology, int nproc, const std::vector<int>& allowed) {
  std::vector<int> allowedSorted = allowed;
  std::sort(allowedSorted.begin(), allowedSorted.end());
  Placement placement;
  std::vector<const Cpu*> sorted;
  for (const Cpu& cpu : topology.cpus)
    if (std::binary_search(allowedSorted.begin(), allowedSorted.end(), cpu.id))
      sorted.push_back(&cpu);
  std::sort(sorted.begin(), sorted.end(), [](const Cpu* a, const Cpu* b) { return a->id < b->id; });
  for (const Cpu* cpu : sorted) placement.allowedByNode[cpu->node].push_back(cpu);

  if (!topology.gpuNodes.empty()) {
    if (static_cast<size_t>(nproc) > topology.gpuNodes.size())
      throw ConfigError("--numa-binding: " + std::to_string(nproc) + " workers but " +
                        std::to_string(topology.gpuNodes.size()) +
                        " GPUs; binding gives worker i the CPUs near GPU i");
    placement.units = topology.gpuNodes;
    placement.unitName = "GPUs";
    return placement;
  }
  std::vector<int> nodes;
  for (const auto& entry : placement.allowedByNode) nodes.push_back(entry.first);
  if (nodes.empty() && nproc > 0)
    throw ConfigError("--numa-binding: no NUMA node has a CPU this process may run on");
  for (int i = 0; i < nproc; ++i) placement.units.push_back(nodes[i * nodes.size() / nproc]);
  placement.unitName = "workers";
  return placement;
}

}  // namespace

std::vector<std::vector<int>> numaCpuSets(const CpuTopology& topology, NumaMode mode, int nproc,
                                          const std::vector<int>& allowed) {
  const Placement placement = place(topology, nproc, allowed);
  std::vector<std::vector<int>> sets;
  for (int i = 0; i < nproc; ++i) {
    const int node = placement.units[i];
    switch (mode) {
      case NumaMode::Node: sets.push_back(ids(placement.cpusOf(node))); break;
      case NumaMode::Socket: sets.push_back(socketCpus(placement, node)); break;
      case NumaMode::Exclusive: sets.push_back(exclusiveCpus(placement, i)); break;
      case NumaMode::CoreComplex: sets.push_back(complexCpus(placement, i)); break;
    }
    if (sets.back().empty())
      throw ConfigError("--numa-binding: local rank " + std::to_string(i) +
                        " would get no CPUs under " + modeName(mode) + ": NUMA node " +
                        std::to_string(node) + " has none this process may run on");
  }
  return sets;
}

}  // namespace dlrun::agents
