#include "trainer/shm_collective.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <new>
#include <optional>
#include <random>
#include <sstream>
#include <utility>

#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"

namespace dlrun::trainer {
namespace {

constexpr size_t kChunk = size_t{1} << 18;  // floats per rank and round: a default gradient
constexpr auto kTimeout = std::chrono::seconds(30);
constexpr auto kCheckEvery = std::chrono::milliseconds(100);  // for exited peers, while waiting
// Spinning first skips the futex round trip when the ranks arrive close together, as they do
// when their steps take equally long (at N=2 on 2 cores 200 us gave ~10% more samples/s than
// none); longer spins would take the CPU from a rank being waited for on a busy machine.
constexpr auto kSpinFor = std::chrono::microseconds(200);

static_assert(std::atomic<uint32_t>::is_always_lock_free && sizeof(std::atomic<uint32_t>) == 4,
              "a futex word must be a plain 32-bit integer");

struct alignas(64) Header {
  uint64_t nonce;  // proves a mapped segment is the one rank 0 named
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> generation;  // the futex word, bumped when the last rank arrives
};

// Each rank holds its mutex while it lives. It is robust, so when the rank exits, however it
// does, the kernel marks it and a peer's trylock says EOWNERDEAD.
struct alignas(64) Member {
  pthread_mutex_t alive;
};

// Header, a Member per rank, a chunk per rank for its values, then a chunk for the sums.
size_t segmentBytes(int size) {
  return sizeof(Header) + size * sizeof(Member) + (size + 1) * kChunk * sizeof(float);
}

long futex(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the waiters are other processes.
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

void pause() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

class Mapping {
 public:
  Mapping(void* base, size_t bytes) : base_(base), bytes_(bytes) {}
  Mapping(Mapping&& other) noexcept
      : base_(std::exchange(other.base_, nullptr)), bytes_(other.bytes_) {}
  Mapping& operator=(Mapping&& other) noexcept {
    std::swap(base_, other.base_);
    std::swap(bytes_, other.bytes_);
    return *this;
  }
  ~Mapping() {
    if (base_ != nullptr) ::munmap(base_, bytes_);
  }
  char* bytes() const { return static_cast<char*>(base_); }

 private:
  void* base_;
  size_t bytes_;
};

Header& headerOf(const Mapping& mapping) { return *reinterpret_cast<Header*>(mapping.bytes()); }

Member& memberOf(const Mapping& mapping, int rank) {
  return reinterpret_cast<Member*>(mapping.bytes() + sizeof(Header))[rank];
}

class SharedMemoryCollective final : public Collective {
 public:
  // This rank holds its Member's mutex.
  SharedMemoryCollective(Mapping mapping, int rank, int size)
      : mapping_(std::move(mapping)), rank_(rank), size_(size) {}
  // Unlocked before the memory goes: glibc links a thread's robust mutexes in a list.
  ~SharedMemoryCollective() override { ::pthread_mutex_unlock(&memberOf(mapping_, rank_).alive); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduceSum(float* data, size_t count) override {
    for (size_t offset = 0; offset < count; offset += kChunk) {
      const size_t n = std::min(kChunk, count - offset);
      std::memcpy(values(rank_), data + offset, n * sizeof(float));
      barrier();
      // This rank's stripe, in whole cache lines, summed in rank order.
      const size_t stripe = ((n + size_ - 1) / size_ + 15) / 16 * 16;
      const size_t begin = std::min(n, rank_ * stripe), end = std::min(n, begin + stripe);
      float* out = sums();
      std::memcpy(out + begin, values(0) + begin, (end - begin) * sizeof(float));
      for (int r = 1; r < size_; ++r) {
        const float* in = values(r);
        for (size_t i = begin; i < end; ++i) out[i] += in[i];
      }
      // After this barrier nobody reads the values again, and before the next one's
      // completion everybody has copied the sums out.
      barrier();
      std::memcpy(data + offset, out, n * sizeof(float));
    }
  }

 private:
  float* values(int r) const {
    return reinterpret_cast<float*>(mapping_.bytes() + sizeof(Header) + size_ * sizeof(Member)) +
           r * kChunk;
  }
  float* sums() const { return values(size_); }

  void barrier() {
    Header& h = headerOf(mapping_);
    const uint32_t generation = h.generation.load(std::memory_order_acquire);
    if (h.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size_)) {
      h.arrived.store(0, std::memory_order_relaxed);
      h.generation.store(generation + 1, std::memory_order_release);
      futex(&h.generation, FUTEX_WAKE, INT32_MAX, nullptr);
      return;
    }
    for (const auto spinUntil = Clock::now() + kSpinFor; Clock::now() < spinUntil;) {
      for (int i = 0; i < 64; ++i) {
        if (h.generation.load(std::memory_order_acquire) != generation) return;
        pause();
      }
    }
    const auto deadline = Clock::now() + kTimeout;
    const timespec slice{0, std::chrono::nanoseconds(kCheckEvery).count()};
    while (h.generation.load(std::memory_order_acquire) == generation) {
      futex(&h.generation, FUTEX_WAIT, generation, &slice);  // returns early when woken
      if (h.generation.load(std::memory_order_acquire) != generation) return;
      if (const int gone = exitedPeer(); gone >= 0) {
        // A peer may exit once this barrier is complete: only one that has not is an error.
        if (h.generation.load(std::memory_order_acquire) != generation) return;
        throw Error("rank " + std::to_string(gone) + " exited in the middle of an all-reduce");
      }
      if (Clock::now() > deadline)
        throw TimeoutError("the shared-memory all-reduce waited " +
                           std::to_string(kTimeout.count()) + " s for the other ranks");
    }
  }

  // A peer whose mutex is no longer held (it exited, or is done with the collective), or -1.
  int exitedPeer() const {
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      const int status = ::pthread_mutex_trylock(&memberOf(mapping_, r).alive);
      if (status == 0) ::pthread_mutex_unlock(&memberOf(mapping_, r).alive);
      if (status == 0 || status == EOWNERDEAD) return r;
    }
    return -1;
  }

  Mapping mapping_;
  int rank_, size_;
};

std::string hex(uint64_t value) {
  std::ostringstream text;
  text << std::hex << value;
  return text.str();
}

uint64_t random64() {
  std::random_device device;
  return (uint64_t{device()} << 32) | device();
}

// Rank 0: creates and initialises the segment `name`; nullopt when it cannot.
std::optional<Mapping> createSegment(const std::string& name, int size) {
  const size_t bytes = segmentBytes(size);
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) {
    log::debug("cannot create shared memory " + name + ": " + std::strerror(errno));
    return std::nullopt;
  }
  // Reserved now, so a full /dev/shm fails here rather than with SIGBUS on a later write.
  const int reserved = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  void* base = reserved == 0 ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                             : MAP_FAILED;
  ::close(fd);
  if (base == MAP_FAILED) {
    log::debug("cannot map shared memory " + name + ": " +
               std::strerror(reserved != 0 ? reserved : errno));
    ::shm_unlink(name.c_str());
    return std::nullopt;
  }
  Mapping mapping(base, bytes);
  new (mapping.bytes()) Header{random64(), {0}, {0}};
  pthread_mutexattr_t attributes;
  ::pthread_mutexattr_init(&attributes);
  ::pthread_mutexattr_setpshared(&attributes, PTHREAD_PROCESS_SHARED);
  ::pthread_mutexattr_setrobust(&attributes, PTHREAD_MUTEX_ROBUST);
  for (int r = 0; r < size; ++r) ::pthread_mutex_init(&memberOf(mapping, r).alive, &attributes);
  ::pthread_mutexattr_destroy(&attributes);
  return mapping;
}

// The other ranks: maps the segment rank 0 named ("NAME NONCE"), if it is on this machine.
std::optional<Mapping> openSegment(const std::string& named, int size) {
  std::istringstream fields(named);
  std::string name, nonce;
  fields >> name >> nonce;
  if (name.empty()) return std::nullopt;  // rank 0 could not make one
  const int fd = ::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) {
    log::debug("cannot open shared memory " + name +
               " (on another machine?): " + std::strerror(errno));
    return std::nullopt;
  }
  const size_t bytes = segmentBytes(size);
  struct stat status {};
  void* base = ::fstat(fd, &status) == 0 && static_cast<size_t>(status.st_size) == bytes
                   ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                   : MAP_FAILED;
  ::close(fd);
  if (base == MAP_FAILED) return std::nullopt;
  Mapping mapping(base, bytes);
  if (hex(headerOf(mapping).nonce) != nonce) return std::nullopt;
  return mapping;
}

}  // namespace

std::unique_ptr<Collective> makeSharedMemoryCollective(Store& store, int rank, int size) {
  std::optional<Mapping> mapping;
  std::string name;
  if (rank == 0) {
    name = "/dlrun-train-" + hex(random64());
    mapping = createSegment(name, size);
    store.set("shm_segment", mapping ? name + " " + hex(headerOf(*mapping).nonce) : "");
  } else {
    mapping = openSegment(store.get("shm_segment"), size);
  }
  if (mapping) ::pthread_mutex_lock(&memberOf(*mapping, rank).alive);
  // Every rank learns every answer, so all choose alike.
  store.set("shm_mapped_" + std::to_string(rank), mapping ? "1" : "0");
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back("shm_mapped_" + std::to_string(r));
  const auto answers = store.multiGet(keys);
  // Whoever could has mapped it by now: the name can go, the memory goes with the last rank.
  if (rank == 0 && mapping) ::shm_unlink(name.c_str());
  if (mapping && std::count(answers.begin(), answers.end(), "1") == size)
    return std::make_unique<SharedMemoryCollective>(std::move(*mapping), rank, size);
  if (mapping) ::pthread_mutex_unlock(&memberOf(*mapping, rank).alive);
  return nullptr;
}

}  // namespace dlrun::trainer
