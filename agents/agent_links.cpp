// The agent's links to other processes: the launcher's connection on stdin (--control-stdin),
// whose lines are signals, a connection to the node serving the workers' store, whose end
// says that node is gone, each attempt's key space on that store, and --store-proxy's proxy
// between the workers and that space.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "agents/agent_impl.h"
#include "common/host_port.h"
#include "common/listen.h"
#include "common/log.h"
#include "common/signal_name.h"
#include "store/tcp_store.h"

namespace dlrun::agents::detail {

// --control-stdin: the launcher's signals arrive as lines on stdin, which moves off fd 0 so the
// workers cannot read it. Once the connection is gone, writes to stdout fail (EPIPE) instead of
// killing the agent before it has stopped its workers.
void AgentImpl::followLauncher() {
  ::signal(SIGPIPE, SIG_IGN);
  const int fd = ::fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3);
  const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd < 0 || null < 0) throw Error("--control-stdin: cannot take over stdin");
  ::dup2(null, STDIN_FILENO);
  ::close(null);
  launcherLink_.assign(fd);
  readLauncher();
}

void AgentImpl::readLauncher() {
  launcherLink_.async_read_some(
      asio::buffer(launcherBuffer_), [this](const boost::system::error_code& ec, size_t n) {
        if (ec == asio::error::operation_aborted || state_ == State::Finished) return;
        if (ec) {
          log::info("the launcher's connection closed");
          return stopOn(SIGHUP);
        }
        launcherLines_.feed(std::string_view(launcherBuffer_.data(), n), [&](auto line) {
          if (auto sig = parseSignal(line); sig && sig != SIGCHLD) onSignal(*sig);
        });
        if (state_ != State::Finished) readLauncher();
      });
}

// A connection to the agent serving the workers' store that waits for nothing: it ends only
// when that agent's process does (its sockets close with it).
void AgentImpl::watchStoreHost() {
  if (!options_.watchStoreHost || world_.groupRank == 0 || !world_.agentStore) return;
  storeHost_.emplace(io_);
  boost::system::error_code ec;
  const auto address = asio::ip::make_address(world_.masterAddr, ec);
  if (ec) return;
  // The store's own port: the attempt's closes when another node opens the next attempt's,
  // which says nothing of the node.
  const std::string what = joinHostPort(world_.masterAddr, world_.storePort);
  const asio::ip::tcp::endpoint at(address, world_.storePort);
  // Where this fails, async_connect opens the socket itself and reports the same failure.
  [[maybe_unused]] const auto opened = openCloseOnExec(*storeHost_, at.protocol());
  storeHost_->async_connect(
      at, [this, attempt = attempt_, what](const boost::system::error_code& error) {
        // Never watched (the lease still is), or stopped meanwhile (stop() let go of it).
        if (error || attempt != attempt_ || !storeHost_) return;
        storeHost_->async_read_some(
            asio::buffer(storeHostByte_),
            [this, attempt, what](const boost::system::error_code& gone, size_t) {
              if (gone == asio::error::operation_aborted || attempt != attempt_ ||
                  state_ != State::Running)
                return;
              log::info("the node serving the workers' store at " + what + " is gone");
              reportToRendezvous([&] {
                rendezvous_.reportLost("the node serving the workers' store at " + what);
              });
            });
      });
}

// The round's key space for its workers. False when the round cannot run here: it is over
// already, or the store is out of reach (the round then ends as that store's node lost).
bool AgentImpl::openAttemptSpace(rendezvous::World& world) {
  if (!options_.attemptSpaces) return true;
  const std::string store = joinHostPort(world.masterAddr, world.storePort);
  try {
    if (const auto port = options_.attemptSpaces->open(world)) {
      world.masterPort = *port;
      return true;
    }
    log::info("round " + std::to_string(world.round) + " is over already: the store at " + store +
              " has a later round's workers");
  } catch (const Error& e) {
    log::info("cannot open round " + std::to_string(world.round) +
              "'s key space for the "
              "workers at " +
              store + ": " + e.what());
    reportToRendezvous(
        [&] { rendezvous_.reportLost("the node serving the workers' store at " + store); });
  }
  return false;
}

// A member with no workers this round: its end decides what follows.
void AgentImpl::sitOut(const rendezvous::World& world) {
  if (state_ != State::Joining) return;  // a signal is ending dlrun
  world_ = world;
  forgetWorkers();
  state_ = State::Done;
  if (roundEnd_) endOfRound();
}

// The job is over (not only this node's part): its last space goes.
void AgentImpl::closeAttemptSpace() {
  using Kind = rendezvous::RoundEnd::Kind;
  const auto& end = stopEnd_ ? stopEnd_ : roundEnd_;
  if (!options_.attemptSpaces || !options_.attemptSpaces->close || world_.storePort == 0 || !end)
    return;
  if (end->kind != Kind::Finished && end->kind != Kind::Stopped &&
      !(end->countsAsFailure() && end->final))
    return;
  try {
    options_.attemptSpaces->close(world_);
  } catch (const Error& e) {
    log::debug(std::string("the job's last key space stays: ") + e.what());
  }
}

void AgentImpl::proxyStore(rendezvous::World& seen) {
  const std::string store = joinHostPort(world_.masterAddr, world_.masterPort);
  if (!proxy_ || proxiedStore_ != store) {
    proxy_.reset();
    proxy_ = std::make_unique<StoreProxy>(
        io_, StoreProxyOptions{.upstream = {world_.masterAddr, world_.masterPort}});
    proxiedStore_ = store;
    log::info("store proxy: this node's workers reach the store at " + store +
              " through 127.0.0.1:" + std::to_string(proxy_->port()));
  }
  seen.masterAddr = "127.0.0.1";
  seen.masterPort = proxy_->port();
}

}  // namespace dlrun::agents::detail

namespace dlrun::agents {

namespace {

TcpStore storeOf(const rendezvous::World& world, std::chrono::milliseconds patience) {
  return TcpStore({.at = {world.masterAddr, world.storePort},
                   .timeout = patience,
                   .connectTimeout = patience,
                   .reconnect = false});
}

}  // namespace

AttemptSpaces attemptSpacesOverTcp() {
  return {
      .open = [](const rendezvous::World& world) -> std::optional<uint16_t> {
        // The store answered this round's rendezvous a moment ago (or, on etcd, its node's
        // lease did): one that does not within a few seconds is gone.
        const uint16_t port =
            storeOf(world, std::chrono::seconds(5)).openSpace(world.runId, world.spaceRound);
        return port == 0 ? std::nullopt : std::optional(port);
      },
      // At exit: a store gone already must not hold the agent up.
      .close =
          [](const rendezvous::World& world) {
            storeOf(world, std::chrono::milliseconds(500)).closeSpace(world.runId);
          },
  };
}

}  // namespace dlrun::agents
