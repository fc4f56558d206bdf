#include "trainer/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "common/text.h"

namespace dlrun::trainer {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'D', 'L', 'R', 'N', 'C', 'K', 'P', 'T'};
constexpr uint32_t kVersion = 1;
constexpr uint64_t kMaxFloats = uint64_t{1} << 30;

template <typename T>
void put(std::string& out, const T& value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

void putFloats(std::string& out, const std::vector<float>& values) {
  put<uint64_t>(out, values.size());
  out.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

class Reader {
 public:
  explicit Reader(std::string_view bytes) : bytes_(bytes) {}
  template <typename T>
  bool get(T& value) {
    if (bytes_.size() < sizeof(T)) return false;
    std::memcpy(&value, bytes_.data(), sizeof(T));
    bytes_.remove_prefix(sizeof(T));
    return true;
  }
  bool getFloats(std::vector<float>& values) {
    uint64_t n = 0;
    if (!get(n) || n > kMaxFloats || bytes_.size() < n * sizeof(float)) return false;
    values.resize(n);
    std::memcpy(values.data(), bytes_.data(), n * sizeof(float));
    bytes_.remove_prefix(n * sizeof(float));
    return true;
  }
  bool done() const { return bytes_.empty(); }

 private:
  std::string_view bytes_;
};

std::string encode(const Checkpoint& c) {
  std::string out(kMagic, sizeof(kMagic));
  put(out, kVersion);
  put<int32_t>(out, c.epoch);
  put<int64_t>(out, c.samplesInEpoch);
  put<int64_t>(out, c.globalStep);
  put<uint32_t>(out, static_cast<uint32_t>(c.widths.size()));
  for (int w : c.widths) put<int32_t>(out, w);
  putFloats(out, c.params);
  putFloats(out, c.velocity);
  put<uint32_t>(
      out, static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(out.data()), out.size())));
  return out;
}

void writeFully(int fd, const std::string& bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error("cannot write checkpoint " + path + ": " + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
}

std::vector<fs::path> checkpointsNewestFirst(const std::string& dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename();
    if (!name.starts_with("checkpoint-") || !name.ends_with(".bin")) continue;
    const std::string_view step = std::string_view(name).substr(11, name.size() - 15);
    if (const auto number = parseInteger<int64_t>(step)) found.emplace_back(*number, entry.path());
  }
  std::sort(found.begin(), found.end(), [](auto& a, auto& b) { return a.first > b.first; });
  std::vector<fs::path> paths;
  for (auto& [step, path] : found) paths.push_back(path);
  return paths;
}

}  // namespace

void saveCheckpoint(const std::string& dir, const Checkpoint& checkpoint, int keep) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string bytes = encode(checkpoint);
  const fs::path final =
      fs::path(dir) / ("checkpoint-" + std::to_string(checkpoint.globalStep) + ".bin");
  const fs::path temp = fs::path(dir) / (".checkpoint-" + std::to_string(::getpid()) + ".tmp");
  int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot write checkpoints to " + dir + ": " + std::strerror(errno));
  try {
    writeFully(fd, bytes, temp.string());
    if (::fsync(fd) != 0)
      throw Error("cannot sync checkpoint " + temp.string() + ": " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    fs::remove(temp, ec);
    throw;
  }
  ::close(fd);
  if (::rename(temp.c_str(), final.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    fs::remove(temp, ec);
    throw Error("cannot write checkpoint " + final.string() + ": " + reason);
  }
  // The rename itself is durable only once the directory is synced.
  if (int dirFd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dirFd >= 0) {
    ::fsync(dirFd);
    ::close(dirFd);
  }
  auto all = checkpointsNewestFirst(dir);
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < all.size(); ++i)
    fs::remove(all[i], ec);
  // Temporary files of writers killed mid-write (one writer per job: rank 0).
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename();
    if (name.starts_with(".checkpoint-") && name.ends_with(".tmp")) fs::remove(entry.path(), ec);
  }
}

std::optional<Checkpoint> readCheckpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream content;
  content << in.rdbuf();
  const std::string bytes = content.str();
  if (bytes.size() < sizeof(kMagic) + 4 || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    return std::nullopt;
  uint32_t storedCrc = 0;
  std::memcpy(&storedCrc, bytes.data() + bytes.size() - 4, 4);
  const auto crc = crc32(0, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size() - 4);
  if (crc != storedCrc) return std::nullopt;
  Reader r(std::string_view(bytes).substr(sizeof(kMagic), bytes.size() - sizeof(kMagic) - 4));
  Checkpoint c;
  uint32_t version = 0, layers = 0;
  int32_t epoch = 0;
  if (!r.get(version) || version != kVersion || !r.get(epoch) || !r.get(c.samplesInEpoch) ||
      !r.get(c.globalStep) || !r.get(layers) || layers > 64)
    return std::nullopt;
  c.epoch = epoch;
  for (uint32_t i = 0; i < layers; ++i) {
    int32_t w = 0;
    if (!r.get(w)) return std::nullopt;
    c.widths.push_back(w);
  }
  if (!r.getFloats(c.params) || !r.getFloats(c.velocity) || !r.done()) return std::nullopt;
  return c;
}

std::optional<Checkpoint> loadNewestCheckpoint(const std::string& dir) {
  for (const auto& path : checkpointsNewestFirst(dir)) {
    if (auto checkpoint = readCheckpoint(path.string())) return checkpoint;
  }
  return std::nullopt;
}

}  // namespace dlrun::trainer
