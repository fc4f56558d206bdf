// A fake libnvidia-ml for gpu_health_test: the six functions dlrun's GPU check calls, their
// answers read from DLRUN_FAKE_NVML at each nvmlInit_v2, as KEY=VALUE;... with
//   init=N      nvmlInit_v2 returns N (9: driver not loaded)
//   count=N     the GPUs listed (0 unless said)
//   countError=N  nvmlDeviceGetCount_v2 returns N
//   lost=I,J    GPUs whose memory query returns 15 (GPU is lost)
//   denied=I    GPUs whose handle query returns 4 (no permission: a cgroup's)
//   hang=PATH   the memory query waits until the file PATH exists (a GPU that hangs the driver)
// and DLRUN_FAKE_NVML_CALLS, where set, a file each call appends its name to.
#include <unistd.h>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace {

struct Fake {
  int init = 0, countError = 0;
  unsigned count = 0;
  std::set<unsigned> lost, denied;
  std::string hang;
};
Fake fake;

std::set<unsigned> indices(const std::string& list) {
  std::set<unsigned> result;
  std::istringstream in(list);
  for (std::string index; std::getline(in, index, ',');) result.insert(std::stoul(index));
  return result;
}

Fake read() {
  Fake f;
  const char* said = std::getenv("DLRUN_FAKE_NVML");
  std::istringstream in(said ? said : "");
  for (std::string pair; std::getline(in, pair, ';');) {
    const size_t eq = pair.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = pair.substr(0, eq), value = pair.substr(eq + 1);
    if (key == "init") f.init = std::stoi(value);
    if (key == "count") f.count = std::stoul(value);
    if (key == "countError") f.countError = std::stoi(value);
    if (key == "lost") f.lost = indices(value);
    if (key == "denied") f.denied = indices(value);
    if (key == "hang") f.hang = value;
  }
  return f;
}

void called(const char* name) {
  if (const char* path = std::getenv("DLRUN_FAKE_NVML_CALLS"))
    std::ofstream(path, std::ios::app) << name << "\n";
}

}  // namespace

extern "C" {

struct nvmlDevice_st;
struct nvmlMemory_st {
  unsigned long long total, free, used;
};

int nvmlInit_v2() {
  called("init");
  fake = read();
  return fake.init;
}

int nvmlShutdown() {
  called("shutdown");
  return 0;
}

int nvmlDeviceGetCount_v2(unsigned* count) {
  *count = fake.countError ? 0 : fake.count;
  return fake.countError;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_st** device) {
  if (index >= fake.count) return 2;  // invalid argument
  if (fake.denied.count(index)) return 4;
  *device = reinterpret_cast<nvmlDevice_st*>(static_cast<uintptr_t>(index) + 1);
  return 0;
}

int nvmlDeviceGetMemoryInfo(nvmlDevice_st* device, nvmlMemory_st* memory) {
  const unsigned index = static_cast<unsigned>(reinterpret_cast<uintptr_t>(device) - 1);
  if (fake.lost.count(index)) return 15;
  // Polls: a fake driver's hang, released by the test.
  while (!fake.hang.empty() && !std::ifstream(fake.hang)) usleep(1000);
  *memory = {80ull << 30, 79ull << 30, 1ull << 30};
  return 0;
}

const char* nvmlErrorString(int error) {
  switch (error) {
    case 2: return "Invalid Argument";
    case 4: return "Insufficient Permissions";
    case 9: return "Driver Not Loaded";
    case 15: return "GPU is lost";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    default: return "Unknown Error";
  }
}

}  // extern "C"
