#include "agents/output.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "agents/console_dedup.h"
#include "common/asio.h"
#include "common/error.h"
#include "common/text.h"

namespace dlrun::agents {

namespace asio = boost::asio;

void writeAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a closed console or a full disk: output is best effort
    bytes.remove_prefix(static_cast<size_t>(n));
  }
}

namespace {

// The length of the UTF-8 sequence at the start of `bytes` when it is well-formed, else the
// negated length of its maximal ill-formed prefix (at least 1): what one U+FFFD replaces.
int utf8Sequence(std::string_view bytes) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  int length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the second byte's range, per the lead
  if (lead >= 0xC2 && lead <= 0xDF)
    length = 2;
  else if (lead >= 0xE0 && lead <= 0xEF)
    length = 3;
  else if (lead >= 0xF0 && lead <= 0xF4)
    length = 4;
  else
    return -1;
  if (lead == 0xE0) low = 0xA0;
  if (lead == 0xED) high = 0x9F;
  if (lead == 0xF0) low = 0x90;
  if (lead == 0xF4) high = 0x8F;
  for (int i = 1; i < length; ++i) {
    const bool fits = static_cast<size_t>(i) < bytes.size() && byte(i) >= (i == 1 ? low : 0x80) &&
                      byte(i) <= (i == 1 ? high : 0xBF);
    if (!fits) return -i;
  }
  return length;
}

}  // namespace

std::string asPythonText(std::string_view line, bool& ended) {
  if (line.ends_with('\r')) {
    line.remove_suffix(1);
    ended = true;
  }
  std::string text;
  text.reserve(line.size());
  while (!line.empty()) {
    const int length = utf8Sequence(line);
    if (length > 0) {
      text.append(line.substr(0, static_cast<size_t>(length)));
    } else {
      text += "\xEF\xBF\xBD";  // U+FFFD
    }
    line.remove_prefix(static_cast<size_t>(length > 0 ? length : -length));
  }
  std::replace(text.begin(), text.end(), '\r', '\n');
  return text;
}

FilteredLog::FilteredLog(const std::filesystem::path& file, std::vector<std::string> needles)
    : fd_(::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)),
      needles_(std::move(needles)) {
  if (fd_ < 0) throw Error("cannot create " + file.string() + ": " + std::strerror(errno));
}

FilteredLog::~FilteredLog() { ::close(fd_); }

void FilteredLog::offer(std::string_view prefix, std::string_view line, bool ended) {
  if (std::none_of(needles_.begin(), needles_.end(),
                   [&](const std::string& needle) { return line.find(needle) != line.npos; }))
    return;
  std::string out(prefix);
  out += line;
  if (ended) out += '\n';
  writeAll(fd_, out);
}

std::string expandPrefix(const std::string& pattern, int rank, int localRank,
                         const std::string& role) {
  return substituteTemplate(pattern, {{"rank", std::to_string(rank)},
                                      {"local_rank", std::to_string(localRank)},
                                      {"role_name", role}});
}

struct StreamPump::Impl : std::enable_shared_from_this<Impl> {
  Impl(asio::io_context& io, int fd, OutputTarget t) : pipe(io, fd), target(std::move(t)) {
    boost::system::error_code ec;
    pipe.non_blocking(true, ec);  // drain() must never block on a pipe a grandchild holds
  }

  void read() {
    pipe.async_read_some(asio::buffer(buffer), [self = shared_from_this()](
                                                   const boost::system::error_code& ec, size_t n) {
      if (self->closed) return;
      self->consume(std::string_view(self->buffer.data(), n));
      if (ec) return self->close();
      // A full read: the worker writes a lot, so read more at a time.
      if (n == self->buffer.size() && n < kMaxBuffer) self->buffer.resize(n * 2);
      self->read();
    });
  }

  void consume(std::string_view bytes) {
    if (bytes.empty()) return;
    if (target.fileFd >= 0) writeAll(target.fileFd, bytes);
    splitter.feed(bytes, [this](std::string_view line) { emit(line, true); });
  }

  // `ended`: the worker wrote a newline after the line (a long line's pieces count as ended).
  void emit(std::string_view line, bool ended) {
    if (target.consoleFd >= 0) {
      if (target.pythonText) {
        const std::string text = asPythonText(line, ended);
        for (size_t at = 0, end; at <= text.size(); at = end + 1) {
          end = std::min(text.find('\n', at), text.size());
          show(std::string_view(text).substr(at, end - at), end < text.size() || ended);
        }
      } else if (!target.exactBytes && splitter.continues()) {
        // dlrun's console lines: a line too long for one says where it was cut (torchrun's
        // bytes, and the log files, stay as the worker wrote them).
        std::string piece(line);
        piece += kCutMark;
        show(piece, true);
      } else {
        show(line, ended || !target.exactBytes);
      }
    }
    if (target.keepLines > 0) {
      last.emplace_back(line);
      if (last.size() > target.keepLines) last.pop_front();
    }
  }

  // One console line, with the prefix, and its copy where it matches the filters.
  void show(std::string_view line, bool newline) {
    if (target.dedup) {
      target.dedup->add(target.rank, target.consoleFd, line, newline);
    } else {
      std::string out = target.prefix;
      out += line;
      if (newline) out += '\n';
      writeAll(target.consoleFd, out);
    }
    if (target.filtered) target.filtered->offer(target.prefix, line, newline);
  }

  // What the pipe holds now, no more: a child of the worker that still writes to it would
  // otherwise keep this loop, and the agent's, from ever ending.
  void drain() {
    if (closed) return;
    int queued = 0;
    if (::ioctl(pipe.native_handle(), FIONREAD, &queued) != 0) queued = 0;
    boost::system::error_code ec;
    for (size_t left = static_cast<size_t>(queued); left > 0;) {
      const size_t n =
          pipe.read_some(asio::buffer(buffer.data(), std::min(left, buffer.size())), ec);
      if (ec) break;  // would_block or eof
      consume(std::string_view(buffer.data(), n));
      left -= n;
    }
    close();
  }

  void close() {
    if (closed) return;
    closed = true;
    splitter.finish([this](std::string_view line) { emit(line, false); });
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
