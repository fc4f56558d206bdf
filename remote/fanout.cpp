// One io_context on the caller's thread drives everything: signals (SIGCHLD reaps the clients),
// the clients' output, and the deadline after a stop. Nothing here blocks.
#include "remote/fanout.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <memory>

#include "agents/output.h"
#include "agents/process.h"
#include "agents/worker_env.h"
#include "common/asio.h"
#include "common/error.h"
#include "common/log.h"
#include "common/signal_name.h"

namespace dlrun::remote {
namespace {

namespace asio = boost::asio;

// After a stop, how long the clients get beyond the agents' own --stop-timeout before they are
// killed (which closes each agent's stdin: it stops its workers all the same).
constexpr auto kStopMargin = std::chrono::seconds(10);

struct Client {
  const FanoutNode* node = nullptr;
  pid_t pid = -1;
  int stdinFd = -1;
  std::unique_ptr<agents::StreamPump> out, err;
  std::optional<agents::ExitStatus> status;
};

class Fanout {
 public:
  explicit Fanout(const FanoutOptions& options)
      : options_(options), signals_(io_), deadline_(io_) {}

  ~Fanout() {
    for (auto& client : clients_)
      if (client.stdinFd >= 0) ::close(client.stdinFd);
  }

  int run() {
    // A client that died makes writes to its stdin fail (EPIPE) instead of ending this process.
    ::signal(SIGPIPE, SIG_IGN);
    signals_.add(SIGCHLD);
    for (int sig : jobSignals(options_.stopSignals)) signals_.add(sig);
    awaitSignal();
    const auto envp = agents::toEnvp(agents::currentEnvironment());
    clients_.reserve(options_.nodes.size());
    for (const auto& node : options_.nodes) start(node, envp);
    live_ = clients_.size();
    io_.run();
    return exitCode();
  }

 private:
  void start(const FanoutNode& node, const std::vector<std::string>& envp) {
    const agents::SpawnedProcess p = agents::spawnProcess({.argv = node.argv,
                                                           .envp = envp,
                                                           .pipeStdout = true,
                                                           .pipeStderr = true,
                                                           .pipeStdin = true});
    Client& client = clients_.emplace_back();
    client.node = &node;
    client.pid = p.pid;
    client.stdinFd = p.stdinFd;
    const std::string prefix = node.host + ": ";
    client.out = std::make_unique<agents::StreamPump>(
        io_, p.stdoutFd, agents::OutputTarget{.consoleFd = STDOUT_FILENO, .prefix = prefix});
    client.err = std::make_unique<agents::StreamPump>(
        io_, p.stderrFd, agents::OutputTarget{.consoleFd = STDERR_FILENO, .prefix = prefix});
    client.out->start();
    client.err->start();
  }

  void awaitSignal() {
    signals_.async_wait([this](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      const auto& stops = options_.stopSignals;
      if (sig == SIGCHLD) {
        reap();
      } else if (std::find(stops.begin(), stops.end(), sig) != stops.end()) {
        if (!signal_) {
          signal_ = sig;
          log::info("received " + signalName(sig) + ", stopping every node");
        }
        stopAll(sig);  // a second one reaches the agents too: they kill their workers at once
      } else if (sig == SIGUSR1 || sig == SIGUSR2) {
        tellAll(sig);  // the agents forward it to their workers
      } else {
        log::info("received " + signalName(sig) +
                  ", which --signals-to-handle leaves out: ignored");
      }
      if (live_ > 0) awaitSignal();
    });
  }

  void reap() {
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      for (auto& client : clients_) {
        if (client.pid != pid) continue;
        client.status = agents::ExitStatus::fromWaitStatus(status);
        client.out->drain();
        client.err->drain();
        ::close(std::exchange(client.stdinFd, -1));
        --live_;
        onExit(client);
      }
    }
    if (live_ == 0) {
      signals_.cancel();
      deadline_.cancel();
      io_.stop();
    }
  }

  // A client ended. After the job's end every agent does; before it, that node is gone, and the
  // others must not wait for it.
  void onExit(Client& client) {
    if (stopping_) return;
    const agents::ExitStatus& status = *client.status;
    if (status.value == 255 && !status.signaled && options_.workersStarted &&
        !options_.workersStarted()) {
      unreachable_ = &client;
      stopping_ = true;
      armDeadline();
      // No worker runs anywhere: the others' clients go at once, and their agents with them.
      for (auto& other : clients_)
        if (!other.status) ::kill(other.pid, SIGTERM);
      return;
    }
    // A client killed, or one whose connection failed (ssh's 255), lost its node whatever the
    // rendezvous says: its agent stops the job as on SIGHUP.
    const bool lost = status.signaled || status.value == 255;
    const bool jobOver = options_.outcome ? options_.outcome().has_value() : status.success();
    if (jobOver && !lost) return;
    failed_ = &client;
    log::info("lost " + client.node->host + ": its ssh client ended (" + status.describe() +
              ") while the job ran; stopping every node");
    stopAll(SIGHUP);
  }

  // Tells every live agent that `sig`, which stops the job, reached the launcher.
  void stopAll(int sig) {
    stopping_ = true;
    armDeadline();
    tellAll(sig);
  }

  void tellAll(int sig) {
    const std::string line = signalName(sig) + "\n";
    for (auto& client : clients_)
      if (client.stdinFd >= 0) [[maybe_unused]]
        auto n = ::write(client.stdinFd, line.data(), line.size());
  }

  void armDeadline() {
    if (deadlineArmed_) return;
    deadlineArmed_ = true;
    deadline_.expires_after(options_.stopTimeout + kStopMargin);
    deadline_.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      for (auto& client : clients_) {
        if (client.status) continue;
        log::info(client.node->host + " did not stop in time; killing its ssh client");
        ::kill(client.pid, SIGKILL);
      }
    });
  }

  int exitCode() const {
    if (unreachable_)
      throw ConfigError("cannot reach " + unreachable_->node->host + " (" +
                        unreachable_->node->where +
                        "): ssh exited with 255 before any worker started (see its line above)");
    if (failed_) {
      log::info("job failed: " + failed_->node->host + " ended with " +
                failed_->status->describe());
      return failed_->status->shellCode();
    }
    if (auto end = options_.outcome ? options_.outcome() : std::nullopt) {
      if (end->kind == rendezvous::RoundEnd::Kind::Finished) return 0;
      log::info("job ended: " + end->describe());
      return end->exitCode;
    }
    if (signal_) return 128 + *signal_;
    for (const auto& client : clients_) {
      if (client.status->success()) continue;
      log::info("job failed: " + client.node->host + " ended with " + client.status->describe());
      return client.status->shellCode();
    }
    return 0;
  }

  const FanoutOptions& options_;
  asio::io_context io_;
  asio::signal_set signals_;
  asio::steady_timer deadline_;
  std::vector<Client> clients_;
  size_t live_ = 0;
  std::optional<int> signal_;
  bool stopping_ = false;
  bool deadlineArmed_ = false;
  const Client* unreachable_ = nullptr;
  const Client* failed_ = nullptr;
};

}  // namespace

int runFanout(const FanoutOptions& options) { return Fanout(options).run(); }

}  // namespace dlrun::remote
