#include "agents/output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/asio.h"
#include "common/error.h"

namespace dlrun::agents {

namespace asio = boost::asio;

namespace {

void writeAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed console or a full disk: output is best effort
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

}  // namespace

FilteredLog::FilteredLog(const std::filesystem::path& file, std::vector<std::string> needles)
    : fd_(::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)),
      needles_(std::move(needles)) {
  if (fd_ < 0) throw Error("cannot create " + file.string() + ": " + std::strerror(errno));
}

FilteredLog::~FilteredLog() { ::close(fd_); }

void FilteredLog::offer(std::string_view prefix, std::string_view line) {
  if (std::none_of(needles_.begin(), needles_.end(),
                   [&](const std::string& needle) { return line.find(needle) != line.npos; }))
    return;
  std::string out(prefix);
  out += line;
  out += '\n';
  writeAll(fd_, out);
}

std::string expandPrefix(const std::string& pattern, int rank, int localRank,
                         const std::string& role) {
  std::string out = pattern;
  auto replace = [&](const std::string& key, const std::string& value) {
    for (size_t at = out.find(key); at != std::string::npos; at = out.find(key, at + value.size()))
      out.replace(at, key.size(), value);
  };
  replace("${rank}", std::to_string(rank));
  replace("${local_rank}", std::to_string(localRank));
  replace("${role_name}", role);
  return out;
}

struct StreamPump::Impl : std::enable_shared_from_this<Impl> {
  Impl(asio::io_context& io, int fd, OutputTarget t) : pipe(io, fd), target(std::move(t)) {
    boost::system::error_code ec;
    pipe.non_blocking(true, ec);  // drain() must never block on a pipe a grandchild holds
  }

  void read() {
    pipe.async_read_some(asio::buffer(buffer),
                         [self = shared_from_this()](const boost::system::error_code& ec,
                                                     size_t n) {
                           if (self->closed) return;
                           self->consume(std::string_view(self->buffer.data(), n));
                           if (ec) return self->close();
                           // A full read: the worker writes a lot, so read more at a time.
                           if (n == self->buffer.size() && n < kMaxBuffer)
                             self->buffer.resize(n * 2);
                           self->read();
                         });
  }

  void consume(std::string_view bytes) {
    if (bytes.empty()) return;
    if (target.fileFd >= 0) writeAll(target.fileFd, bytes);
    splitter.feed(bytes, [this](std::string_view line) { emit(line); });
  }

  void emit(std::string_view line) {
    if (target.consoleFd >= 0) {
      std::string out = target.prefix;
      out += line;
      out += '\n';
      writeAll(target.consoleFd, out);
      if (target.filtered) target.filtered->offer(target.prefix, line);
    }
    if (target.keepLines > 0) {
      last.emplace_back(line);
      if (last.size() > target.keepLines) last.pop_front();
    }
  }

  void drain() {
    if (closed) return;
    boost::system::error_code ec;
    while (true) {
      const size_t n = pipe.read_some(asio::buffer(buffer), ec);
      if (ec) break;  // would_block (nothing more now) or eof
      consume(std::string_view(buffer.data(), n));
    }
    close();
  }

  void close() {
    if (closed) return;
    closed = true;
    splitter.finish([this](std::string_view line) { emit(line); });
    boost::system::error_code ec;
    pipe.close(ec);
    if (target.fileFd >= 0) ::close(target.fileFd);
    target.fileFd = -1;
  }

  asio::posix::stream_descriptor pipe;
  OutputTarget target;
  LineSplitter splitter;
  // Small until a worker writes much: a node of thousands of mostly quiet workers would
  // otherwise hold hundreds of megabytes of buffers.
  static constexpr size_t kMaxBuffer = 64 * 1024;
  std::vector<char> buffer = std::vector<char>(1024);
  std::deque<std::string> last;
  bool closed = false;
};

StreamPump::StreamPump(asio::io_context& io, int fd, OutputTarget target)
    : impl_(std::make_shared<Impl>(io, fd, std::move(target))) {}

StreamPump::~StreamPump() { impl_->close(); }

void StreamPump::start() { impl_->read(); }

void StreamPump::drain() { impl_->drain(); }

const std::deque<std::string>& StreamPump::lastLines() const { return impl_->last; }

}  // namespace dlrun::agents
