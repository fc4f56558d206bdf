// The agent's links to other processes: the launcher's connection on stdin (--control-stdin),
// whose lines are signals, a connection to the node serving the workers' store, whose end
// says that node is gone, and --store-proxy's proxy between the workers and that store.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "agents/agent_impl.h"
#include "common/host_port.h"
#include "common/log.h"
#include "common/signal_name.h"

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
  const std::string what = joinHostPort(world_.masterAddr, world_.masterPort);
  storeHost_->async_connect(
      {address, world_.masterPort},
      [this, attempt = attempt_, what](const boost::system::error_code& error) {
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

void AgentImpl::proxyStore(rendezvous::World& seen) {
  const std::string store = joinHostPort(world_.masterAddr, world_.masterPort);
  if (!proxy_ || proxiedStore_ != store) {
    proxy_.reset();
    proxy_ = std::make_unique<StoreProxy>(
        io_, StoreProxyOptions{.upstreamHost = world_.masterAddr,
                               .upstreamPort = world_.masterPort});
    proxiedStore_ = store;
    log::info("store proxy: this node's workers reach the store at " + store +
              " through 127.0.0.1:" + std::to_string(proxy_->port()));
  }
  seen.masterAddr = "127.0.0.1";
  seen.masterPort = proxy_->port();
}

}  // namespace dlrun::agents::detail
