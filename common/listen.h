// How every dlrun server takes a TCP port and accepts on it (the store, --metrics-port, the
// liveness port, the parameter server): one listen sequence, one accept loop with one stop;
// and how every socket is opened close-on-exec.
#pragma once

#include <functional>
#include <string>

#include "common/asio.h"

namespace dlrun {

// Opens `acceptor` at `at`: address reuse (a restarted server takes its port back while the
// last run's connections sit in TIME_WAIT), IPv4 too on an IPv6 address such as "::", and
// close-on-exec (workers the agent starts must not inherit the port). Returns the error of
// the step that failed, for a caller that words its own message.
boost::system::error_code openListener(boost::asio::ip::tcp::acceptor& acceptor,
                                       const boost::asio::ip::tcp::endpoint& at, int backlog);

// Opens `socket` for `protocol`, close-on-exec from the start: Asio's open() (and so its
// async_connect on a closed socket) leaves a descriptor every program this process executes
// inherits, the agent's workers among them.
boost::system::error_code openCloseOnExec(boost::asio::ip::tcp::acceptor& socket,
                                          const boost::asio::ip::tcp& protocol);
boost::system::error_code openCloseOnExec(boost::asio::ip::tcp::socket& socket,
                                          const boost::asio::ip::tcp& protocol);

// The same on a new acceptor; throws NetworkError "cannot listen on WHAT: REASON".
boost::asio::ip::tcp::acceptor listenOn(
    boost::asio::io_context& io, const boost::asio::ip::tcp::endpoint& at, const std::string& what,
    int backlog = boost::asio::socket_base::max_listen_connections);

// Accepts on a listening acceptor until stop(). Runs on the acceptor's io_context thread.
class Listener {
 public:
  using OnSocket = std::function<void(boost::asio::ip::tcp::socket)>;
  using OnFailure = std::function<void(const boost::system::error_code&)>;

  explicit Listener(boost::asio::ip::tcp::acceptor acceptor);

  // Hands each connection, close-on-exec already, to onSocket. A failed accept (out of
  // descriptors, mostly) goes to onFailure and is retried 50 ms later: retrying at once would
  // spin. The handlers hold both callbacks, so a callback that holds the Listener's owner
  // (its shared_ptr) keeps it alive until the last handler has run.
  void start(OnSocket onSocket, OnFailure onFailure);

  // Closes the acceptor and cancels a pending retry; no handler calls back after it. Returns
  // false when already stopped, so an owner's stop() runs its own part once too.
  bool stop();
  bool stopped() const { return stopped_; }

  boost::asio::ip::tcp::endpoint local() const { return bound_; }

 private:
  void accept(OnSocket onSocket, OnFailure onFailure);

  boost::asio::ip::tcp::acceptor acceptor_;
  boost::asio::steady_timer retry_;
  boost::asio::ip::tcp::endpoint bound_;
  bool stopped_ = false;
};

}  // namespace dlrun
