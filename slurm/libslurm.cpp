#include "slurm/libslurm.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>

namespace dlrun::slurm {
namespace {

// libslurm's C API for hostlists (slurm/slurm.h), declared here so that nothing of Slurm is needed
// to build dlrun: these four have kept their signatures since Slurm 2.x.
struct SlurmHostlist;
using Create = SlurmHostlist* (*)(const char*);
using Count = int (*)(SlurmHostlist*);
using Shift = char* (*)(SlurmHostlist*);
using Destroy = void (*)(SlurmHostlist*);

// Newest first: Slurm 24.11 is libslurm.so.42, 22.05 (Debian 12) .38.
constexpr int kNewestSoname = 60;
constexpr int kOldestSoname = 30;

struct Library {
  void* handle = nullptr;
  std::string name;
  Create create = nullptr;
  Count count = nullptr;
  Shift shift = nullptr;
  Destroy destroy = nullptr;

  bool open(const std::string& candidate) {
    void* h = ::dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) return false;
    create = reinterpret_cast<Create>(::dlsym(h, "slurm_hostlist_create"));
    count = reinterpret_cast<Count>(::dlsym(h, "slurm_hostlist_count"));
    shift = reinterpret_cast<Shift>(::dlsym(h, "slurm_hostlist_shift"));
    destroy = reinterpret_cast<Destroy>(::dlsym(h, "slurm_hostlist_destroy"));
    if (!create || !count || !shift || !destroy) {
      ::dlclose(h);
      return false;
    }
    handle = h;
    name = candidate;
    return true;
  }
};

// Kept for the process's life: a library's handle is never closed once its functions are used.
const Library& library() {
  static Library lib;
  static std::once_flag once;
  std::call_once(once, [] {
    if (const char* chosen = std::getenv("DLRUN_LIBSLURM"); chosen && *chosen) {
      lib.open(chosen);
      return;  // the user's choice, or none: never another behind their back
    }
    if (lib.open("libslurm.so")) return;
    for (int n = kNewestSoname; n >= kOldestSoname; --n)
      if (lib.open("libslurm.so." + std::to_string(n))) return;
  });
  return lib;
}

}  // namespace

std::optional<std::vector<std::string>> libslurmExpand(const std::string& expression) {
  const Library& lib = library();
  if (!lib.handle) return std::nullopt;
  std::unique_ptr<SlurmHostlist, Destroy> list(lib.create(expression.c_str()), lib.destroy);
  if (!list) return std::nullopt;
  std::vector<std::string> hosts;
  hosts.reserve(static_cast<size_t>(std::max(lib.count(list.get()), 0)));
  while (char* host = lib.shift(list.get())) {
    hosts.emplace_back(host);
    std::free(host);
  }
  return hosts;
}

std::string libslurmName() { return library().name; }

}  // namespace dlrun::slurm
