// torchrun's --numa-binding (agents/numa_binding.h): the topology read from a fake sysfs tree of
// a two-socket machine with eight GPUs, and each mode's CPU sets, as torch 2.13 computes them.
#include "agents/numa_binding.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <numeric>

#include "common/error.h"

namespace dlrun::agents {
namespace {

namespace fs = std::filesystem;

using Sets = std::vector<std::vector<int>>;

// The message of the ConfigError `call` throws; "" when it throws none.
template <typename Call>
std::string configError(Call call) {
  try {
    call();
  } catch (const ConfigError& error) {
    return error.what();
  }
  return "";
}

std::vector<int> cpus(std::string_view text) { return parseCpuList(text); }

std::vector<int> allCpus() {
  std::vector<int> all(32);
  std::iota(all.begin(), all.end(), 0);
  return all;
}

// Each set as text, to compare whole results at a glance.
std::vector<std::string> texts(const Sets& sets) {
  std::vector<std::string> out;
  for (const auto& set : sets) out.push_back(cpuListText(set));
  return out;
}

// Two sockets, one NUMA node each: node 0 has CPUs 0-7 and their hyperthreads 16-23, node 1 has
// 8-15 and 24-31; every four cores share an L3. GPUs 0-3 (by PCI address) hang off node 0, 4-7
// off node 1; the tree lists them out of order among a NIC, an NVSwitch and the BMC's VGA.
class NumaBindingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = (fs::temp_directory_path() / "numa_binding_test.XXXXXX").string();
    ASSERT_NE(::mkdtemp(dir.data()), nullptr);
    root_ = dir;
    write("sys/devices/system/cpu/online", "0-31\n");
    write("sys/devices/system/node/possible", "0-1\n");
    write("sys/devices/system/node/node0/cpulist", "0-7,16-23\n");
    write("sys/devices/system/node/node1/cpulist", "8-15,24-31\n");
    for (int cpu = 0; cpu < 32; ++cpu) writeCpu(cpu);
    const std::pair<const char*, int> gpus[] = {
        {"0000:9a:00.0", 1}, {"0000:18:00.0", 0}, {"0000:db:00.0", 1}, {"0000:3a:00.0", 0},
        {"0000:ab:00.0", 1}, {"0000:5d:00.0", 0}, {"0000:ba:00.0", 1}, {"0000:2a:00.0", 0}};
    for (const auto& [address, node] : gpus) writePci(address, "0x10de", "0x030200", node);
    writePci("0000:2a:00.0", "0x10de", "0x030000", 0);  // a GPU may be a VGA controller
    writePci("0000:17:00.0", "0x15b3", "0x020700", 0);  // a Mellanox NIC
    writePci("0000:03:00.0", "0x1a03", "0x030000", 0);  // the BMC's ASPEED VGA
    writePci("0000:05:00.0", "0x10de", "0x068000", 0);  // an NVSwitch: NVIDIA, but no GPU
  }
  void TearDown() override { fs::remove_all(root_); }

  void write(const fs::path& file, const std::string& text) {
    fs::create_directories((root_ / file).parent_path());
    std::ofstream(root_ / file) << text;
  }

  void writeCpu(int cpu) {
    const int core = cpu % 16;
    const fs::path dir = "sys/devices/system/cpu/cpu" + std::to_string(cpu);
    write(dir / "topology/physical_package_id", core < 8 ? "0\n" : "1\n");
    const std::string siblings = std::to_string(core) + "," + std::to_string(core + 16) + "\n";
    write(dir / "topology/thread_siblings_list", siblings);
    const int first = core / 4 * 4;
    const std::string l3 = std::to_string(first) + "-" + std::to_string(first + 3) + "," +
                           std::to_string(first + 16) + "-" + std::to_string(first + 19) + "\n";
    writeCache(dir / "cache/index0", "Data", 1, siblings);
    writeCache(dir / "cache/index1", "Instruction", 1, siblings);
    writeCache(dir / "cache/index2", "Unified", 2, siblings);
    writeCache(dir / "cache/index3", "Unified", 3, l3);
  }

  void writeCache(const fs::path& dir, const std::string& type, int level,
                  const std::string& shared) {
    write(dir / "type", type + "\n");
    write(dir / "level", std::to_string(level) + "\n");
    write(dir / "shared_cpu_list", shared);
  }

  void writePci(const std::string& address, const std::string& vendor, const std::string& pciClass,
                int node) {
    const fs::path dir = fs::path("sys/bus/pci/devices") / address;
    write(dir / "vendor", vendor + "\n");
    write(dir / "class", pciClass + "\n");
    write(dir / "numa_node", std::to_string(node) + "\n");
  }

  CpuTopology read(const std::optional<std::string>& visible = std::nullopt) {
    return readCpuTopology(root_, visible);
  }

  fs::path root_;
};

TEST_F(NumaBindingTest, ReadsCpusAndGpusInPciOrder) {
  const CpuTopology topology = read();
  EXPECT_EQ(topology.gpuNodes, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1}));
  ASSERT_EQ(topology.cpus.size(), 32u);
  for (int id = 0; id < 32; ++id) EXPECT_EQ(topology.cpus[id].id, id);
  const CpuTopology::Cpu& cpu = topology.cpus[25];
  EXPECT_EQ(cpu.node, 1);
  EXPECT_EQ(cpu.socket, 1);
  EXPECT_EQ(cpu.siblings, (std::vector<int>{9, 25}));
  EXPECT_EQ(cpu.complex, cpus("8-11,24-27"));  // the L3, not the L1 or L2
  EXPECT_EQ(topology.cpus[18].node, 0);
  EXPECT_EQ(topology.cpus[18].socket, 0);
}

// Torch takes the first unified or data cache of the highest level; instruction caches do not
// count.
TEST_F(NumaBindingTest, TheComplexIsTheHighestUnifiedOrDataCache) {
  writeCache("sys/devices/system/cpu/cpu0/cache/index4", "Instruction", 4, "0-31\n");
  writeCache("sys/devices/system/cpu/cpu0/cache/index5", "Unified", 3, "0\n");
  EXPECT_EQ(read().cpus[0].complex, cpus("0-3,16-19"));
}

// An offline CPU has no topology in sysfs, whatever its node's list says.
TEST_F(NumaBindingTest, OfflineCpusAreLeftOut) {
  write("sys/devices/system/cpu/online", "0-30\n");
  fs::remove_all(root_ / "sys/devices/system/cpu/cpu31");
  const CpuTopology topology = read();
  ASSERT_EQ(topology.cpus.size(), 31u);
  EXPECT_EQ(topology.cpus.back().id, 30);
}

TEST_F(NumaBindingTest, NodeModeGivesEachWorkerItsGpusNode) {
  EXPECT_EQ(texts(numaCpuSets(read(), NumaMode::Node, 8, allCpus())),
            (std::vector<std::string>{"0-7,16-23", "0-7,16-23", "0-7,16-23", "0-7,16-23",
                                      "8-15,24-31", "8-15,24-31", "8-15,24-31", "8-15,24-31"}));
}

TEST_F(NumaBindingTest, SocketModeWithOneNodePerSocketIsNodeMode) {
  EXPECT_EQ(numaCpuSets(read(), NumaMode::Socket, 8, allCpus()),
            numaCpuSets(read(), NumaMode::Node, 8, allCpus()));
  EXPECT_EQ(cpuListText(numaCpuSets(read(), NumaMode::Socket, 8, allCpus())[5]), "8-15,24-31");
}

TEST_F(NumaBindingTest, ExclusiveModeSplitsTheNodesCoresWithTheirThreads) {
  EXPECT_EQ(texts(numaCpuSets(read(), NumaMode::Exclusive, 8, allCpus())),
            (std::vector<std::string>{"0-1,16-17", "2-3,18-19", "4-5,20-21", "6-7,22-23",
                                      "8-9,24-25", "10-11,26-27", "12-13,28-29", "14-15,30-31"}));
}

TEST_F(NumaBindingTest, CoreComplexModeDealsTheNodesL3Complexes) {
  EXPECT_EQ(texts(numaCpuSets(read(), NumaMode::CoreComplex, 8, allCpus())),
            (std::vector<std::string>{"0-3,16-19", "4-7,20-23", "0-3,16-19", "4-7,20-23",
                                      "8-11,24-27", "12-15,28-31", "8-11,24-27", "12-15,28-31"}));
}

// Torch shares a node's cores among all its GPUs, also those no worker uses.
TEST_F(NumaBindingTest, FewerWorkersThanGpusKeepTheGpusShares) {
  EXPECT_EQ(texts(numaCpuSets(read(), NumaMode::Exclusive, 2, allCpus())),
            (std::vector<std::string>{"0-1,16-17", "2-3,18-19"}));
}

TEST_F(NumaBindingTest, CudaVisibleDevicesSelectsAndReordersGpus) {
  EXPECT_EQ(read("4,5,6,7,0,1,2,3").gpuNodes, (std::vector<int>{1, 1, 1, 1, 0, 0, 0, 0}));
  EXPECT_EQ(cpuListText(numaCpuSets(read("4,5,6,7,0,1,2,3"), NumaMode::Node, 8, allCpus())[0]),
            "8-15,24-31");
  EXPECT_EQ(read("7,0").gpuNodes, (std::vector<int>{1, 0}));
  // As CUDA: an index out of range or repeated hides itself and the rest.
  EXPECT_EQ(read("1,9,4").gpuNodes, (std::vector<int>{0}));
  EXPECT_EQ(read("4,4,0").gpuNodes, (std::vector<int>{1}));
  EXPECT_TRUE(read("-1").gpuNodes.empty());
  EXPECT_TRUE(read("").gpuNodes.empty());
  // The exclusive split among the visible GPUs of a node: two on node 1 here.
  EXPECT_EQ(texts(numaCpuSets(read("6,5"), NumaMode::Exclusive, 2, allCpus())),
            (std::vector<std::string>{"8-11,24-27", "12-15,28-31"}));
}

TEST_F(NumaBindingTest, GpuUuidsInCudaVisibleDevicesAreRefused) {
  const std::string message = configError([&] { read("0,GPU-8e2f7c4a-1b2c-3d4e-5f60-718293a4"); });
  EXPECT_NE(message.find("--numa-binding: CUDA_VISIBLE_DEVICES must list GPU indices"),
            std::string::npos)
      << message;
  EXPECT_NE(configError([&] { read("MIG-0"); }), "");
}

TEST_F(NumaBindingTest, MoreWorkersThanGpusIsAnError) {
  const std::string message =
      configError([&] { numaCpuSets(read(), NumaMode::Node, 9, allCpus()); });
  EXPECT_NE(message.find("--numa-binding: 9 workers but 8 GPUs"), std::string::npos) << message;
  EXPECT_NE(configError([&] { numaCpuSets(read("0,1"), NumaMode::Node, 3, allCpus()); }), "");
}

TEST_F(NumaBindingTest, WithoutGpusWorkersAreSpreadOverNodesInBlocks) {
  CpuTopology topology = read("");
  EXPECT_EQ(texts(numaCpuSets(topology, NumaMode::Node, 4, allCpus())),
            (std::vector<std::string>{"0-7,16-23", "0-7,16-23", "8-15,24-31", "8-15,24-31"}));
  EXPECT_EQ(texts(numaCpuSets(topology, NumaMode::Exclusive, 4, allCpus())),
            (std::vector<std::string>{"0-3,16-19", "4-7,20-23", "8-11,24-27", "12-15,28-31"}));
  EXPECT_EQ(texts(numaCpuSets(topology, NumaMode::Exclusive, 3, allCpus())),
            (std::vector<std::string>{"0-3,16-19", "4-7,20-23", "8-15,24-31"}));
  // Only nodes with allowed CPUs take workers.
  EXPECT_EQ(texts(numaCpuSets(topology, NumaMode::Node, 2, cpus("8-9"))),
            (std::vector<std::string>{"8-9", "8-9"}));
}

TEST_F(NumaBindingTest, OnlyAllowedCpusAreGiven) {
  const CpuTopology topology = read();
  const std::vector<int> allowed = cpus("0-5,16-21,8-15,24-31");
  EXPECT_EQ(cpuListText(numaCpuSets(topology, NumaMode::Node, 8, allowed)[1]), "0-5,16-21");
  // Six cores for four GPUs: the first two GPUs get one more.
  EXPECT_EQ(texts(numaCpuSets(topology, NumaMode::Exclusive, 4, allowed)),
            (std::vector<std::string>{"0-1,16-17", "2-3,18-19", "4,20", "5,21"}));
  // A core brings only its allowed threads.
  EXPECT_EQ(cpuListText(numaCpuSets(topology, NumaMode::Exclusive, 1, cpus("1-7,16-31"))[0]),
            "1,16-17");
  // The complex with more allowed CPUs goes first.
  EXPECT_EQ(texts(numaCpuSets(topology, NumaMode::CoreComplex, 2, cpus("2-7,18-23"))),
            (std::vector<std::string>{"4-7,20-23", "2-3,18-19"}));
}

TEST_F(NumaBindingTest, ExclusiveWithFewerCoresThanGpusIsAnError) {
  const std::string message = configError(
      [&] { numaCpuSets(read(), NumaMode::Exclusive, 8, cpus("0-2,8-15,16-18,24-31")); });
  EXPECT_NE(message.find("NUMA node 0 has 3 allowed physical cores for 4 GPUs"), std::string::npos)
      << message;
}

TEST_F(NumaBindingTest, AWorkerWithoutCpusIsAnError) {
  const std::string message =
      configError([&] { numaCpuSets(read(), NumaMode::Node, 8, cpus("0-7")); });
  EXPECT_NE(message.find("local rank 4 would get no CPUs under node"), std::string::npos)
      << message;
}

TEST_F(NumaBindingTest, UnknownGpuNodeIsNodeZero) {
  write("sys/bus/pci/devices/0000:db:00.0/numa_node", "-1\n");
  EXPECT_EQ(read().gpuNodes, (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 0}));
}

TEST_F(NumaBindingTest, WithoutNumaInSysfsEveryCpuIsOnNodeZero) {
  fs::remove_all(root_ / "sys/devices/system/node");
  for (const char* gpu : {"18", "2a", "3a", "5d", "9a", "ab", "ba", "db"})
    fs::remove(root_ / "sys/bus/pci/devices" / ("0000:" + std::string(gpu) + ":00.0/numa_node"));
  write("sys/devices/system/cpu/online", "0-29\n");  // two CPUs offline
  const CpuTopology topology = read();
  EXPECT_EQ(topology.gpuNodes, std::vector<int>(8, 0));
  ASSERT_EQ(topology.cpus.size(), 30u);
  for (const auto& cpu : topology.cpus) EXPECT_EQ(cpu.node, 0);
  EXPECT_EQ(cpuListText(numaCpuSets(topology, NumaMode::Node, 8, allCpus())[7]), "0-29");
}

TEST_F(NumaBindingTest, AMalformedOrMissingFileIsNamed) {
  write("sys/devices/system/cpu/cpu5/topology/physical_package_id", "zero\n");
  std::string message = configError([&] { read(); });
  EXPECT_NE(message.find("cpu5/topology/physical_package_id holds \"zero\", not an integer"),
            std::string::npos)
      << message;
  fs::remove(root_ / "sys/devices/system/cpu/cpu5/topology/physical_package_id");
  message = configError([&] { read(); });
  const fs::path topology = root_ / "sys/devices/system/cpu/cpu5/topology";
  EXPECT_NE(message.find("cannot read " + topology.string() + "/physical_package_id"),
            std::string::npos)
      << message;
  write("sys/devices/system/node/node1/cpulist", "8-15,x\n");
  EXPECT_NE(configError([&] { read(); }).find("node1/cpulist holds \"8-15,x\", not a CPU list"),
            std::string::npos);
}

// Two NUMA nodes per socket, built directly: socket mode takes both of the GPU's socket.
TEST(NumaCpuSets, SocketModeTakesEveryNodeOfTheSocket) {
  CpuTopology topology;
  for (int id = 0; id < 8; ++id) topology.cpus.push_back({id, id / 2, id / 4, {id}, {}});
  topology.gpuNodes = {3, 0};
  EXPECT_EQ(texts(numaCpuSets(topology, NumaMode::Socket, 2, cpus("0-7"))),
            (std::vector<std::string>{"4-7", "0-3"}));
  EXPECT_EQ(texts(numaCpuSets(topology, NumaMode::Node, 2, cpus("0-7"))),
            (std::vector<std::string>{"6-7", "0-1"}));
  // Without cache information there are no complexes to bind to.
  EXPECT_NE(configError([&] {
              numaCpuSets(topology, NumaMode::CoreComplex, 1, cpus("0-7"));
            }).find("core-complex needs the caches of CPU 6"),
            std::string::npos);
}

TEST(ParseNumaMode, TorchsFourModesOnly) {
  EXPECT_EQ(parseNumaMode("node"), NumaMode::Node);
  EXPECT_EQ(parseNumaMode("socket"), NumaMode::Socket);
  EXPECT_EQ(parseNumaMode("exclusive"), NumaMode::Exclusive);
  EXPECT_EQ(parseNumaMode("core-complex"), NumaMode::CoreComplex);
  for (const char* bad : {"", "Node", "core_complex", "numa", "node "})
    EXPECT_EQ(parseNumaMode(bad), std::nullopt) << bad;
}

TEST(ParseCpuList, SysfsListsAndTheirText) {
  EXPECT_EQ(parseCpuList("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parseCpuList("9,2-3,3"), (std::vector<int>{2, 3, 9}));
  EXPECT_TRUE(parseCpuList("").empty());
  EXPECT_TRUE(parseCpuList("\n").empty());
  EXPECT_EQ(cpuListText({11, 8, 0, 1, 2, 3, 10, 3}), "0-3,8,10-11");
  EXPECT_EQ(cpuListText({5}), "5");
  EXPECT_EQ(cpuListText({}), "");
}

TEST(ParseCpuList, BadTextIsAnError) {
  for (const char* bad : {"a", "3-1", "1-", "-1", "1,,2", "0-3:2/4", "1 2", "0-99999999"})
    EXPECT_NE(configError([&] { parseCpuList(bad); }).find("--numa-binding: "), std::string::npos)
        << bad;
}

}  // namespace
}  // namespace dlrun::agents
