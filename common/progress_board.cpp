#include "common/progress_board.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "common/error.h"
#include "common/text.h"

namespace dlrun {
namespace {

std::string why() { return std::strerror(errno); }

// Maps `size` bytes of the open file `fd` shared; closes fd.
void* mapShared(int fd, size_t size, const std::string& path) {
  void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const std::string error = why();
  ::close(fd);
  if (map == MAP_FAILED) throw Error("cannot map the progress board " + path + ": " + error);
  return map;
}

}  // namespace

ProgressReporter ProgressReporter::fromEnvironment() {
  const char* path = std::getenv("DLRUN_PROGRESS_FILE");
  if (path == nullptr || *path == '\0') return {};
  const char* local = std::getenv("LOCAL_RANK");
  const int slot = local == nullptr ? -1 : parseInteger<int>(local).value_or(-1);
  if (slot < 0) throw ConfigError("DLRUN_PROGRESS_FILE is set but LOCAL_RANK is not a local rank");
  const int fd = ::open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) throw ConfigError("DLRUN_PROGRESS_FILE=" + std::string(path) + ": " + why());
  struct stat info {};
  const size_t need = sizeof(ProgressSlot) * (static_cast<size_t>(slot) + 1);
  if (::fstat(fd, &info) != 0 || static_cast<size_t>(info.st_size) < need) {
    ::close(fd);
    throw ConfigError("DLRUN_PROGRESS_FILE=" + std::string(path) + " has no slot for LOCAL_RANK " +
                      std::to_string(slot));
  }
  const size_t size = static_cast<size_t>(info.st_size);
  void* map = mapShared(fd, size, path);
  return ProgressReporter(map, size, static_cast<ProgressSlot*>(map) + slot);
}

ProgressReporter::ProgressReporter(ProgressReporter&& other) noexcept
    : map_(std::exchange(other.map_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      slot_(std::exchange(other.slot_, nullptr)) {}

ProgressReporter& ProgressReporter::operator=(ProgressReporter&& other) noexcept {
  if (this != &other) {
    if (map_) ::munmap(map_, size_);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
    slot_ = std::exchange(other.slot_, nullptr);
  }
  return *this;
}

ProgressReporter::~ProgressReporter() {
  if (map_) ::munmap(map_, size_);
}

// The fields first, the beat last (release): a reader that sees the beat sees the fields.
void ProgressReporter::step(int64_t step, int64_t epoch) {
  if (!slot_) return;
  slot_->step.store(step, std::memory_order_relaxed);
  slot_->epoch.store(epoch, std::memory_order_relaxed);
  slot_->phase.store(static_cast<uint32_t>(ProgressPhase::Computing), std::memory_order_relaxed);
  slot_->beats.fetch_add(1, std::memory_order_release);
}

void ProgressReporter::phase(ProgressPhase phase) {
  if (!slot_) return;
  slot_->phase.store(static_cast<uint32_t>(phase), std::memory_order_relaxed);
  slot_->beats.fetch_add(1, std::memory_order_release);
}

ProgressBoard::ProgressBoard(std::filesystem::path path, int workers)
    : path_(std::move(path)), workers_(workers) {
  size_ = sizeof(ProgressSlot) * static_cast<size_t>(std::max(workers, 1));
  const int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw Error("cannot create the progress board " + path_.string() + ": " + why());
  if (::ftruncate(fd, static_cast<off_t>(size_)) != 0) {
    const std::string error = why();
    ::close(fd);
    throw Error("cannot size the progress board " + path_.string() + ": " + error);
  }
  map_ = mapShared(fd, size_, path_.string());  // a new file reads as zeros: nothing reported
}

ProgressBoard::~ProgressBoard() {
  ::munmap(map_, size_);
  ::unlink(path_.c_str());
}

void ProgressReporter::loss(double loss, int64_t samples) {
  if (!slot_) return;
  slot_->loss.store(loss, std::memory_order_relaxed);
  slot_->samples.store(samples, std::memory_order_relaxed);
  slot_->results.store(slot_->results.load(std::memory_order_relaxed) | kReportedLoss,
                       std::memory_order_relaxed);
}

void ProgressReporter::accuracy(double accuracy) {
  if (!slot_) return;
  slot_->accuracy.store(accuracy, std::memory_order_relaxed);
  slot_->results.store(slot_->results.load(std::memory_order_relaxed) | kReportedAccuracy,
                       std::memory_order_relaxed);
}

ProgressReading ProgressBoard::read(int localRank) const {
  const auto& slot = static_cast<const ProgressSlot*>(map_)[localRank];
  ProgressReading reading;
  reading.beats = slot.beats.load(std::memory_order_acquire);
  reading.step = slot.step.load(std::memory_order_relaxed);
  reading.epoch = slot.epoch.load(std::memory_order_relaxed);
  reading.phase = static_cast<ProgressPhase>(slot.phase.load(std::memory_order_relaxed));
  reading.results = slot.results.load(std::memory_order_relaxed);
  reading.loss = slot.loss.load(std::memory_order_relaxed);
  reading.accuracy = slot.accuracy.load(std::memory_order_relaxed);
  reading.samples = slot.samples.load(std::memory_order_relaxed);
  return reading;
}

}  // namespace dlrun
