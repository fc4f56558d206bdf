// The agent's side of warm starts (warm_start.h): the zygote's start and readiness on the
// io_context, then each worker's start as one request and its answer.
#include "agents/warm_start.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "common/asio.h"
#include "common/clock.h"
#include "common/error.h"
#include "common/log.h"
#include "common/program_files.h"

namespace dlrun::agents {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

// How long a start may wait for the zygote's answer: two forks, unless it is stuck.
constexpr auto kAnswerTimeout = 30s;

// The zygote stopped answering: the caller starts the worker fresh.
class ZygoteLost : public Error {
 public:
  using Error::Error;
};

// A descriptor that closes itself.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    reset(std::exchange(other.fd_, -1));
    return *this;
  }
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

std::string errnoText(int error) { return std::strerror(error); }

std::pair<Fd, Fd> socketPair() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
    throw Error("warm start: cannot create a socket pair: " + errnoText(errno));
  return {Fd(fds[0]), Fd(fds[1])};
}

// A worker's output pipe: the read end (the agent's, non-blocking) and the write end.
std::pair<Fd, Fd> outputPipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw Error(std::string("cannot create a pipe for a worker: ") + errnoText(errno));
  ::fcntl(fds[0], F_SETFL, ::fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  return {Fd(fds[0]), Fd(fds[1])};
}

// Waits until `fd` is ready for `events` or `deadline` passes (false).
bool awaitFd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    pollfd p{.fd = fd, .events = events, .revents = 0};
    const int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

// Sends `frame` with `fds` riding on its first byte.
void sendFrame(int socket, const std::string& frame, const std::vector<int>& fds,
               Clock::time_point deadline) {
  size_t sent = 0;
  while (sent < frame.size()) {
    iovec data{.iov_base = const_cast<char*>(frame.data() + sent), .iov_len = frame.size() - sent};
    msghdr message{};
    message.msg_iov = &data;
    message.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * warm::kSpawnDescriptors)] = {};
    if (sent == 0) {
      message.msg_control = control;
      message.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      cmsghdr* header = CMSG_FIRSTHDR(&message);
      header->cmsg_level = SOL_SOCKET;
      header->cmsg_type = SCM_RIGHTS;
      header->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(header), fds.data(), sizeof(int) * fds.size());
    }
    const ssize_t n = ::sendmsg(socket, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && errno == EAGAIN) {
      if (!awaitFd(socket, POLLOUT, deadline))
        throw ZygoteLost("the zygote took no request for " +
                         std::to_string(kAnswerTimeout.count()) + " s");
    } else if (n < 0 && errno != EINTR) {
      throw ZygoteLost("the zygote's socket failed: " + errnoText(errno));
    }
  }
}

}  // namespace

Environment zygoteEnvironment(const Environment& inherited, int localWorkers,
                              const Environment& services) {
  Environment env = inherited;
  if (localWorkers > 1) env.try_emplace("OMP_NUM_THREADS", "1");
  env.try_emplace("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1");
  env.try_emplace("NCCL_ASYNC_ERROR_HANDLING", "1");
  for (const auto& [key, value] : services) env[key] = value;
  return env;
}

std::string zygoteProgram() {
  constexpr std::string_view name = "dlrun_warm_start.py";
  std::string path = findProgramFile(name, DLRUN_PYTHON_DIR);
  if (path.empty())
    throw ConfigError("--warm-start: dlrun's " + std::string(name) +
                      " is neither beside dlrun nor in " DLRUN_PYTHON_DIR
                      " from it: reinstall dlrun");
  return path;
}

struct Zygote::Impl {
  explicit Impl(asio::io_context& io) : io(io), channel(io) {}

  asio::io_context& io;
  asio::posix::stream_descriptor channel;  // the agent's end of the control socket
  pid_t pid = -1;
  bool reaped = false;
  State state = State::Starting;
  bool everReady = false;
  std::string problem;
  std::function<void()> onSettled;
  std::string buffer;  // what came of a frame so far
  // --ready-spares: the workers forked ahead for a place (by local rank), each with its end of
  // the go socket, over which its place comes; and the pids of those stopped unplaced, whose
  // ends are reaped here.
  struct Reserve {
    pid_t pid = -1;
    Fd place;
  };
  std::map<int, Reserve> reserves;
  std::set<pid_t> dropped;

  void awaitReady();
  void onReadable();
  void settle(State to, std::string why);
  void kill() {
    if (!reaped && pid > 0) ::kill(pid, SIGKILL);
  }
  std::string name() const { return "the zygote (pid " + std::to_string(pid) + ")"; }
  warm::Reply answer(Clock::time_point deadline);
  // `keepGo`: where the agent's end of the worker's go socket stays open (a reserve's)
  SpawnedProcess fork(const SpawnRequest& request, Fd* keepGo = nullptr);
  std::optional<SpawnedProcess> place(const SpawnRequest& request, int local);
  void drop(Reserve reserve) {
    dropped.insert(reserve.pid);
    ::kill(-reserve.pid, SIGKILL);  // its group: it leads one before its pid is known
  }
};

namespace {

// What a worker is to become, as the zygote (or a reserve) reads it.
warm::SpawnMessage spawnMessage(const SpawnRequest& request) {
  warm::SpawnMessage message{.agentPid = static_cast<uint32_t>(::getpid()),
                             .argv = request.argv,
                             .cwd = {},
                             .cpus = request.cpus};
  message.envp.reserve(request.sharedEnvp.size() + request.envp.size());
  message.envp.assign(request.sharedEnvp.begin(), request.sharedEnvp.end());
  message.envp.insert(message.envp.end(), request.envp.begin(), request.envp.end());
  std::error_code error;
  message.cwd = std::filesystem::current_path(error).string();  // empty: the zygote's
  return message;
}

// A worker's standard streams as the request asks: the agent's ends (read ends of the pipes)
// and the descriptors the worker takes as 0, 1 and 2.
struct WorkerStreams {
  Fd outRead, outWrite, errRead, errWrite, nullIn;
  std::vector<int> theirs;

  explicit WorkerStreams(const SpawnRequest& request) {
    if (request.pipeStdout) std::tie(outRead, outWrite) = outputPipe();
    if (request.pipeStderr) std::tie(errRead, errWrite) = outputPipe();
    int stdinFd = STDIN_FILENO;
    if (request.nullStdin || ::fcntl(STDIN_FILENO, F_GETFD) < 0) {
      nullIn.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      stdinFd = nullIn.get();
    }
    theirs = {stdinFd, outWrite.get() >= 0 ? outWrite.get() : STDOUT_FILENO,
              errWrite.get() >= 0 ? errWrite.get() : STDERR_FILENO};
  }
  // The worker holds its own copies now: its output pipes reach end of file when it is gone.
  void sent() {
    outWrite.reset();
    errWrite.reset();
  }
};

}  // namespace

void Zygote::Impl::awaitReady() {
  channel.async_wait(asio::posix::stream_descriptor::wait_read,
                     [this](const boost::system::error_code& ec) {
                       if (!ec && state == State::Starting) onReadable();
                     });
}

// The first frame: Ready or Refused.
void Zygote::Impl::onReadable() {
  char chunk[4096];
  const ssize_t n = ::recv(channel.native_handle(), chunk, sizeof chunk, MSG_DONTWAIT);
  if (n == 0) return settle(State::Failed, name() + " ended before it was ready");
  if (n < 0) {
    if (errno == EAGAIN || errno == EINTR) return awaitReady();
    return settle(State::Failed, name() + ": " + errnoText(errno));
  }
  buffer.append(chunk, static_cast<size_t>(n));
  size_t used = 0;
  std::optional<warm::Reply> reply;
  try {
    reply = warm::decodeReply(buffer, used);
  } catch (const ProtocolError& e) {
    return settle(State::Failed, e.what());
  }
  if (!reply) return awaitReady();
  buffer.erase(0, used);
  if (reply->kind == warm::Reply::Kind::Ready) {
    log::info("warm start: " + reply->text);
    return settle(State::Ready, {});
  }
  if (reply->kind == warm::Reply::Kind::Refused) return settle(State::Failed, reply->text);
  settle(State::Failed, name() + " answered before it was asked");
}

void Zygote::Impl::settle(State to, std::string why) {
  if (state != State::Starting) return;
  state = to;
  everReady = to == State::Ready;
  if (to == State::Failed) {
    problem = "warm start: " + std::move(why);
    kill();
  }
  asio::post(io, onSettled);
}

warm::Reply Zygote::Impl::answer(Clock::time_point deadline) {
  for (;;) {
    size_t used = 0;
    std::optional<warm::Reply> reply;
    try {
      reply = warm::decodeReply(buffer, used);
    } catch (const ProtocolError& e) {
      throw ZygoteLost(e.what());
    }
    if (reply) {
      buffer.erase(0, used);
      return *reply;
    }
    if (!awaitFd(channel.native_handle(), POLLIN, deadline))
      throw ZygoteLost(name() + " did not answer within " + std::to_string(kAnswerTimeout.count()) +
                       " s");
    char chunk[4096];
    const ssize_t n = ::recv(channel.native_handle(), chunk, sizeof chunk, MSG_DONTWAIT);
    if (n == 0) throw ZygoteLost(name() + " ended");
    if (n < 0 && errno != EAGAIN && errno != EINTR)
      throw ZygoteLost(name() + ": " + errnoText(errno));
    if (n > 0) buffer.append(chunk, static_cast<size_t>(n));
  }
}

// One worker forked from the zygote; see warm_start.h for the order of things.
SpawnedProcess Zygote::Impl::fork(const SpawnRequest& request, Fd* keepGo) {
  WorkerStreams streams(request);
  auto [go, workerGo] = socketPair();
  std::vector<int> fds = streams.theirs;
  fds.push_back(workerGo.get());
  const auto deadline = Clock::now() + kAnswerTimeout;
  sendFrame(channel.native_handle(), warm::encodeSpawn(spawnMessage(request)), fds, deadline);
  streams.sent();
  workerGo.reset();
  const warm::Reply reply = answer(deadline);
  if (reply.kind == warm::Reply::Kind::Failed)
    throw Error("cannot start " + request.argv.front() +
                " from the warm-start zygote: " + reply.text);
  if (reply.kind != warm::Reply::Kind::Spawned || reply.pid == 0)
    throw ZygoteLost(name() + " answered out of turn");
  // The pid is known (the caller records it before it reaps anything): the worker may go on.
  // Its parent is this process already, since the zygote reaped the middle child first.
  [[maybe_unused]] ssize_t n = ::send(go.get(), "g", 1, MSG_NOSIGNAL);
  if (keepGo) *keepGo = std::move(go);
  return {.pid = static_cast<pid_t>(reply.pid),
          .stdoutFd = streams.outRead.release(),
          .stderrFd = streams.errRead.release()};
}

// The reserve waiting for local rank `local` takes `request`: its environment, working
// directory, CPUs and streams, sent over its go socket to dlrun.recovery's loop
// (python/dlrun/_reserve.py). None where none waits, or it is gone (a fresh fork then).
std::optional<SpawnedProcess> Zygote::Impl::place(const SpawnRequest& request, int local) {
  auto it = reserves.find(local);
  if (it == reserves.end()) return std::nullopt;
  WorkerStreams streams(request);  // before it leaves the map: a failure here leaves it tracked
  Reserve reserve = std::move(it->second);
  reserves.erase(it);
  try {
    sendFrame(reserve.place.get(), warm::encodeSpawn(spawnMessage(request)), streams.theirs,
              Clock::now() + kAnswerTimeout);
  } catch (const ZygoteLost&) {  // it ended, or does not read: not this worker
    drop(std::move(reserve));
    return std::nullopt;
  }
  streams.sent();
  return SpawnedProcess{.pid = reserve.pid,
                        .stdoutFd = streams.outRead.release(),
                        .stderrFd = streams.errRead.release()};
}

Zygote::Zygote(asio::io_context& io, const WarmStartOptions& options,
               const Environment& environment, const std::vector<std::string>& longestArgv,
               int standbys, std::function<void()> onSettled)
    : impl_(std::make_unique<Impl>(io)) {
  impl_->onSettled = std::move(onSettled);
  std::vector<std::string> argv = options.interpreter;
  argv.push_back(zygoteProgram());
  std::string modules;
  for (const auto& name : options.preload) modules += (modules.empty() ? "" : ",") + name;
  argv.push_back(modules);
  argv.push_back(std::to_string(standbys));
  argv.push_back("--");
  argv.insert(argv.end(), longestArgv.begin(), longestArgv.end());
  auto [agentEnd, zygoteEnd] = socketPair();
  std::vector<std::string> envp;
  for (const auto& [key, value] : environment) envp.push_back(key + "=" + value);
  impl_->pid =
      spawnProcess({.argv = std::move(argv), .envp = std::move(envp), .stdinFrom = zygoteEnd.get()})
          .pid;
  impl_->channel.assign(agentEnd.release());
  impl_->awaitReady();
}

Zygote::~Zygote() {
  for (auto& [local, reserve] : impl_->reserves) ::kill(-reserve.pid, SIGKILL);
  impl_->kill();
  if (!impl_->reaped && impl_->pid > 0) ::waitpid(impl_->pid, nullptr, 0);
}

Zygote::State Zygote::state() const { return impl_->state; }
bool Zygote::everReady() const { return impl_->everReady; }
const std::string& Zygote::problem() const { return impl_->problem; }
pid_t Zygote::pid() const { return impl_->pid; }

SpawnedProcess Zygote::start(const SpawnRequest& request, int reserve) {
  if (reserve >= 0)
    if (auto placed = impl_->place(request, reserve)) return *placed;
  if (impl_->state != State::Ready) return spawnProcess(request);
  try {
    return impl_->fork(request);
  } catch (const ZygoteLost& e) {
    log::info(std::string("warm start: ") + e.what() + "; workers start fresh from now on");
    impl_->state = State::Failed;
    impl_->problem = e.what();
    impl_->kill();
  }
  return spawnProcess(request);
}

void Zygote::reserve(const SpawnRequest& request, int local) {
  if (impl_->state != State::Ready || impl_->reserves.contains(local)) return;
  Impl::Reserve reserve;
  try {
    reserve.pid = impl_->fork(request, &reserve.place).pid;
  } catch (const ZygoteLost& e) {  // as start(): its answers cannot be trusted from now on
    log::info(std::string("warm start: ") + e.what() + "; workers start fresh from now on");
    impl_->state = State::Failed;
    impl_->problem = e.what();
    impl_->kill();
    return;
  } catch (const Error& e) {  // the spare's workers start when it is placed, as without
    log::info(std::string("cannot start a worker ahead: ") + e.what());
    return;
  }
  impl_->reserves.emplace(local, std::move(reserve));
}

bool Zygote::dropping() const { return !impl_->dropped.empty(); }

void Zygote::dropReserves() {
  for (auto& [local, reserve] : impl_->reserves) impl_->drop(std::move(reserve));
  impl_->reserves.clear();
}

bool Zygote::reaped(pid_t pid, const ExitStatus& status) {
  if (impl_->dropped.erase(pid) > 0) return true;
  for (auto it = impl_->reserves.begin(); it != impl_->reserves.end(); ++it) {
    if (it->second.pid != pid) continue;
    log::info("the worker started ahead for local rank " + std::to_string(it->first) + " ended (" +
              status.describe() + ") before its place came; that rank's worker starts afresh then");
    impl_->reserves.erase(it);
    return true;
  }
  if (pid != impl_->pid || impl_->reaped) return false;
  impl_->reaped = true;
  if (impl_->state == State::Starting) {
    impl_->settle(State::Failed,
                  impl_->name() + " ended with " + status.describe() + " before it was ready");
  } else if (impl_->state == State::Ready) {
    impl_->state = State::Failed;
    impl_->problem = impl_->name() + " ended with " + status.describe();
    log::info("warm start: " + impl_->problem + "; workers start fresh from now on");
  }
  return true;
}

}  // namespace dlrun::agents
