#include "agents/checkpoint_peer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <thread>
#include <vector>

#include "agents/checkpoint_wire.h"
#include "common/asio.h"
#include "common/error.h"
#include "common/host_port.h"
#include "common/listen.h"
#include "common/log.h"
#include "store/tcp_stream.h"

namespace dlrun::agents {

namespace fs = std::filesystem;
namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

constexpr size_t kChunk = 4 << 20;  // bytes a read or a write moves at once: whole blocks
constexpr size_t kPeerStepsKept = 2;
constexpr std::chrono::seconds kPeerConnectLimit{5};

std::string systemError(const std::string& what) { return what + ": " + std::strerror(errno); }

// A file's bytes mapped read-only (a copy's tensors as they are sent).
class MappedFile {
 public:
  explicit MappedFile(const fs::path& file) {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw Error(systemError("cannot open " + file.string()));
    size_ = static_cast<size_t>(::lseek(fd, 0, SEEK_END));
    data_ = size_ ? ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0) : nullptr;
    ::close(fd);
    if (data_ == MAP_FAILED) throw Error(systemError("cannot map " + file.string()));
  }
  ~MappedFile() {
    if (data_ && data_ != MAP_FAILED) ::munmap(data_, size_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::string_view bytes() const { return {static_cast<const char*>(data_), size_}; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

fs::path peerRankDir(const fs::path& memory, int rank) {
  return memory / "peer" / ("rank-" + std::to_string(rank));
}

fs::path stepDir(const fs::path& rankDir, int64_t step) {
  return rankDir / ("step-" + std::to_string(step));
}

struct Found {
  fs::path dir;
  bool slot = false;  // a worker's slot (read under its lock), else a copy a peer sent
};

// A copy of `step` of `rank` in `memory`: one a peer sent, else one of the rank's own slots.
std::optional<Found> findCopy(const fs::path& memory, int rank, int64_t step) {
  const fs::path sent = stepDir(peerRankDir(memory, rank), step);
  if (readMark(sent / "step") == step) return Found{sent};
  for (const fs::path& slot : slotsOf(memory / ("rank-" + std::to_string(rank))))
    if (readMark(slot / "step") == step) return Found{slot, true};
  return std::nullopt;
}

// Of the copies peers sent for a rank, all but the newest kPeerStepsKept go.
void prunePeerCopies(const fs::path& rankDir) {
  std::map<int64_t, fs::path> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(rankDir, ec))
    if (const auto step = numbered(entry.path(), "step-")) steps[*step] = entry.path();
  while (steps.size() > kPeerStepsKept) {
    fs::remove_all(steps.begin()->second, ec);
    steps.erase(steps.begin());
  }
}

// One peer's request: read, done, answered, closed. Its handlers hold it.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, const fs::path& memory)
      : socket_(std::move(socket)), idle_(socket_.get_executor()), memory_(memory) {}

  ~Connection() { discard(); }

  void start() {
    awake();
    readLine();
  }

 private:
  // The connection dropped once silent for kPeerIdleLimit.
  void awake() {
    idle_.expires_after(kPeerIdleLimit);
    idle_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (!ec) self->socket_.close();
    });
  }

  // A byte at a time: the line is short, and the copy's bytes after it must stay unread.
  void readLine() {
    asio::async_read(socket_, asio::buffer(&byte_, 1),
                     [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                       if (ec) return self->close();
                       if (self->byte_ != '\n') {
                         if (self->line_.size() + 1 >= kPeerLineMax)
                           return self->answer(noLine("a request's line is too long"));
                         self->line_ += self->byte_;
                         return self->readLine();
                       }
                       self->onLine();
                     });
  }

  void onLine() {
    try {
      request_ = parseRequest(line_);
      if (request_.put) return receive();
      serve();
    } catch (const std::exception& e) {
      answer(noLine(e.what()));
    }
  }

  // PUT: into peer/rank-R/.step-S.new, checked, then renamed to step-S.
  void receive() {
    const CopyHeader& copy = request_.copy;
    const fs::path rankDir = peerRankDir(memory_, request_.rank);
    struct statvfs fs;
    if (::statvfs(memory_.c_str(), &fs) == 0 &&
        copy.metaBytes + copy.tensorBytes > fs.f_bavail * fs.f_frsize)
      throw Error(memory_.string() + " has no room for a copy of " +
                  std::to_string((copy.metaBytes + copy.tensorBytes) >> 20) + " MiB");
    // A name of this connection's own: two peers may send the same step of a rank at once.
    static std::atomic<uint64_t> connections{0};
    made_ = rankDir /
            (".step-" + std::to_string(request_.step) + ".new-" + std::to_string(++connections));
    fs::remove_all(made_);
    fs::create_directories(made_);
    fd_ = ::open((made_ / "tensors").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd_ < 0 || ::posix_fallocate(fd_, 0, static_cast<off_t>(copy.tensorBytes)) != 0)
      throw Error("cannot make room for a copy in " + made_.string());
    left_ = copy.tensorBytes;
    meta_.resize(copy.metaBytes);
    asio::async_read(socket_, asio::buffer(meta_),
                     [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                       if (ec) return self->close();
                       self->awake();
                       self->checksum_.setMeta(self->meta_);
                       std::ofstream(self->made_ / "meta", std::ios::binary) << self->meta_;
                       self->receiveTensors();
                     });
  }

  void receiveTensors() {
    if (left_ == 0) return keep();
    chunk_.resize(kChunk);
    const size_t n = std::min<uint64_t>(left_, kChunk);
    asio::async_read(
        socket_, asio::buffer(chunk_.data(), n),
        [self = shared_from_this(), n](const boost::system::error_code& ec, size_t) {
          if (ec) return self->close();
          self->awake();
          self->checksum_.addTensors(self->chunk_.data(), n);
          const off_t at = static_cast<off_t>(self->request_.copy.tensorBytes - self->left_);
          if (::pwrite(self->fd_, self->chunk_.data(), n, at) != static_cast<ssize_t>(n))
            return self->answer(noLine(systemError("cannot write the copy")));
          self->left_ -= n;
          self->receiveTensors();
        });
  }

  void keep() {
    ::close(fd_);
    fd_ = -1;
    if (checksum_.text() != request_.copy.checksum)
      return answer(noLine("the copy of step " + std::to_string(request_.step) + " of rank " +
                           std::to_string(request_.rank) + " does not match its checksum"));
    std::ofstream(made_ / "step") << request_.step << ' ' << request_.copy.checksum << '\n';
    const fs::path rankDir = made_.parent_path();
    const fs::path kept = stepDir(rankDir, request_.step);
    std::error_code ec;
    fs::remove_all(kept, ec);
    fs::rename(made_, kept, ec);
    if (ec) return answer(noLine("cannot keep the copy: " + ec.message()));
    made_.clear();
    prunePeerCopies(rankDir);
    answer("OK\n");
  }

  // GET: the copy, from a peer's or a slot (read under its lock: its worker waits to rewrite it).
  void serve() {
    const auto copy = findCopy(memory_, request_.rank, request_.step);
    if (!copy)
      return answer(noLine("no copy of step " + std::to_string(request_.step) + " of rank " +
                           std::to_string(request_.rank) + " here"));
    if (copy->slot) lock_.emplace(copy->dir);
    const auto mark = readText(copy->dir / "step");
    const auto line = mark ? numberAndWord(*mark) : std::nullopt;
    if (!line || line->first != request_.step)
      return answer(noLine("the copy of step " + std::to_string(request_.step) + " changed"));
    tensors_.emplace(copy->dir / "tensors");
    meta_ = readText(copy->dir / "meta").value_or("");
    head_ = haveLine({.metaBytes = meta_.size(),
                      .tensorBytes = tensors_->bytes().size(),
                      .checksum = line->second}) +
            meta_;
    asio::async_write(socket_, asio::buffer(head_),
                      [self = shared_from_this()](const boost::system::error_code& ec, size_t) {
                        ec ? self->close() : self->sendTensors(0);
                      });
  }

  void sendTensors(size_t at) {
    const std::string_view bytes = tensors_->bytes();
    if (at >= bytes.size()) return close();
    const size_t n = std::min(kChunk, bytes.size() - at);
    awake();
    asio::async_write(
        socket_, asio::buffer(bytes.data() + at, n),
        [self = shared_from_this(), at, n](const boost::system::error_code& ec, size_t) {
          ec ? self->close() : self->sendTensors(at + n);
        });
  }

  // The last word; a copy not kept is gone before it is said.
  void answer(std::string line) {
    discard();
    head_ = std::move(line);
    asio::async_write(
        socket_, asio::buffer(head_),
        [self = shared_from_this()](const boost::system::error_code&, size_t) { self->close(); });
  }

  // A copy being received and not kept (cut short, refused) removed.
  void discard() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    std::error_code ec;
    if (!made_.empty()) fs::remove_all(made_, ec);
    made_.clear();
  }

  void close() {
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_send, ec);
    socket_.close(ec);
    idle_.cancel();
  }

  tcp::socket socket_;
  asio::steady_timer idle_;
  const fs::path memory_;
  char byte_ = 0;
  std::string line_;
  PeerRequest request_;
  // PUT
  fs::path made_;  // the copy being received, removed unless kept
  int fd_ = -1;
  uint64_t left_ = 0;
  std::string meta_;
  std::vector<char> chunk_;
  CopyChecksum checksum_;
  // GET
  std::optional<SlotReadLock> lock_;
  std::optional<MappedFile> tensors_;
  std::string head_;  // the answer's line (and a GET's structure after it)
};

tcp::endpoint endpointOf(asio::io_context& io, const std::string& host) {
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (!ec) return {address, 0};
  tcp::resolver resolver(io);
  const auto found = resolver.resolve(host, "0", ec);
  if (ec || found.empty())
    throw NetworkError("cannot resolve " + host + " for checkpoint copies: " + ec.message());
  return {found.begin()->endpoint().address(), 0};
}

}  // namespace

struct CheckpointPeerServer::Impl {
  Impl(fs::path memory, const std::string& host)
      : memory(std::move(memory)),
        listener(listenOn(io, endpointOf(io, host), "checkpoint copies")),
        host(host) {}

  asio::io_context io{1};
  fs::path memory;
  Listener listener;
  std::string host;
  std::thread thread;
};

CheckpointPeerServer::CheckpointPeerServer(fs::path memory, const std::string& host)
    : impl_(std::make_unique<Impl>(std::move(memory), host)) {
  impl_->listener.start(
      [impl = impl_.get()](tcp::socket socket) {
        std::make_shared<Connection>(std::move(socket), impl->memory)->start();
      },
      [](const boost::system::error_code& ec) {
        log::info("checkpoint copies: cannot accept a connection: " + ec.message());
      });
  impl_->thread = std::thread([impl = impl_.get()] {
    for (;;) {
      try {
        impl->io.run();  // returns once stopped
        return;
      } catch (const std::exception& e) {  // a file system error in a handler: that copy alone
        log::info(std::string("checkpoint copies: ") + e.what());
      }
    }
  });
}

CheckpointPeerServer::~CheckpointPeerServer() {
  asio::post(impl_->io, [impl = impl_.get()] {
    impl->listener.stop();
    impl->io.stop();  // connections under way end with it
  });
  impl_->thread.join();
}

std::string CheckpointPeerServer::address() const {
  return joinHostPort(impl_->host, impl_->listener.local().port());
}

namespace {

// Sends the copy in `slot` (marked `step`) to the agent at `to`; throws Error naming why not.
void sendCopy(const fs::path& slot, int rank, int64_t step, const std::string& to) {
  const SlotReadLock reading(slot);
  const auto mark = readText(slot / "step");
  const auto line = mark ? numberAndWord(*mark) : std::nullopt;
  if (!line || line->first != step)
    throw Error("its copy of step " + std::to_string(step) + " changed");
  const MappedFile tensors(slot / "tensors");
  const std::string meta = readText(slot / "meta").value_or("");
  const HostPort peer = parseHostPort(to, 0);
  // A peer that stops reading for kPeerIdleLimit is given up, whatever the copy's size.
  auto deadline = [] { return Clock::now() + kPeerIdleLimit; };
  // A peer host that is gone answers nothing: its connect is given up sooner.
  TcpStream stream = TcpStream::connect(peer.host, peer.port, Clock::now() + kPeerConnectLimit);
  stream.writeAll(putLine(rank, step,
                          {.metaBytes = meta.size(),
                           .tensorBytes = tensors.bytes().size(),
                           .checksum = line->second}),
                  deadline());
  stream.writeAll(meta, deadline());
  for (size_t at = 0; at < tensors.bytes().size(); at += kChunk)
    stream.writeAll(tensors.bytes().substr(at, kChunk), deadline());
  std::string answer;
  while (!answer.ends_with('\n') && answer.size() < kPeerLineMax) {
    const std::string some = stream.readSome(kPeerLineMax, deadline());
    if (some.empty()) throw NetworkError("the peer closed the connection without an answer");
    answer += some;
  }
  answer.pop_back();
  parseAnswer(answer);
}

}  // namespace

CopyReport sendRequested(const fs::path& memory) {
  CopyReport report;
  forEachRequest(
      memory, "replicate", [&](int rank, const fs::path& slot, const std::string& request) {
        const auto line = numberAndWord(request);  // "STEP HOST:PORT"
        bool sent = false;
        try {
          if (!line) throw Error("a request that is not 'STEP HOST:PORT'");
          sendCopy(slot, rank, line->first, line->second);
          report.copied.emplace_back(rank, line->first);
          sent = true;
        } catch (const std::exception& e) {
          report.problems.push_back("rank " + std::to_string(rank) + " to " +
                                    (line ? line->second : std::string("?")) + ": " + e.what());
        }
        // The outcome before the request goes: its worker counts the step once it is gone.
        std::ofstream(slot / "replicated")
            << (line ? line->first : -1) << (sent ? " sent\n" : " failed\n");
      });
  return report;
}

}  // namespace dlrun::agents
