// torchrun's --numa-binding (torch 2.13, torch/numa/binding.py): the CPUs each worker is bound
// to. Reading the machine (sysfs under a root) is apart from the computation, which is pure.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlrun::agents {

enum class NumaMode { Node, Socket, Exclusive, CoreComplex };

// "node", "socket", "exclusive" or "core-complex" (torch's AffinityMode values); else nullopt.
std::optional<NumaMode> parseNumaMode(std::string_view text);

// The sorted, distinct CPUs of a sysfs list ("0-3,8,10-11\n"); blank text is no CPUs. Throws
// ConfigError on anything else.
std::vector<int> parseCpuList(std::string_view text);

// `cpus` sorted, distinct, with runs as ranges: "0-3,8,10-11" (numactl's --physcpubind form).
std::string cpuListText(const std::vector<int>& cpus);

// What the binding needs from sysfs; pure data, so tests may build it directly.
struct CpuTopology {
  struct Cpu {
    int id;
    int node;
    int socket;                 // physical_package_id
    std::vector<int> siblings;  // thread_siblings_list: the CPUs of its physical core
    std::vector<int> complex;   // CPUs sharing its highest-level unified or data cache; empty if
                                // sysfs does not say
  };
  std::vector<Cpu> cpus;      // online CPUs that belong to a NUMA node
  std::vector<int> gpuNodes;  // NUMA node of each visible GPU, in CUDA's index order
};

// The topology under `root` ("/" normally). GPUs are NVIDIA's display and 3D controllers among
// the PCI devices, in PCI address order; `visibleDevices` (CUDA_VISIBLE_DEVICES where set)
// selects and reorders them as CUDA does, and must hold indices, not UUIDs. A machine without
// NUMA nodes in sysfs has one, node 0, with every online CPU. Throws ConfigError naming the
// file that cannot be read or holds something else than expected.
CpuTopology readCpuTopology(const std::filesystem::path& root,
                            const std::optional<std::string>& visibleDevices);

// Each local rank's CPUs (index: local rank) among `allowed` (the agent's affinity): worker i
// uses GPU i. Without GPUs, workers are spread over the NUMA nodes with allowed CPUs in blocks
// (worker i on node i * nodes / nproc), the workers of a node taking the GPUs' part. Throws
// ConfigError when there are more workers than GPUs, when `exclusive` has under one physical
// core per GPU, and when a worker would get no CPUs.
std::vector<std::vector<int>> numaCpuSets(const CpuTopology& topology, NumaMode mode, int nproc,
                                          const std::vector<int>& allowed);

}  // namespace dlrun::agents
