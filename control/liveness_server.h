// torchrun's TORCHELASTIC_HEALTH_CHECK_PORT (ARCHITECTURE.md section 10). PyTorch 2.x's agent
// hands that port to a health-check server which open-source PyTorch leaves empty (it logs "No
// health check server started"; 1.13 reads nothing). dlrun answers there plainly: the agent's
// process is alive. Each connection gets one "HTTP/1.1 200 OK", so TCP and HTTP probes both
// pass. It runs on an io_context thread of its own, beside the agent's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

namespace boost::asio {
class io_context;
}

namespace dlrun::control {

class LivenessServer {
 public:
  // Listens on host:port at once; throws NetworkError when it cannot.
  LivenessServer(const std::string& host, uint16_t port);
  ~LivenessServer();  // stops serving and joins its thread
  LivenessServer(const LivenessServer&) = delete;
  LivenessServer& operator=(const LivenessServer&) = delete;

  uint16_t port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<boost::asio::io_context> io_;
  std::shared_ptr<Impl> impl_;
  uint16_t port_ = 0;
  std::thread thread_;
};

}  // namespace dlrun::control
