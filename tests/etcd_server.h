// A real etcd for tests: Debian's /usr/bin/etcd (scripts/setup.sh installs it) as a one-member
// cluster on loopback, with a temporary data directory and free ports. start() waits until a
// Range answers (bounded, no fixed sleeps); the destructor stops it by PID (SIGTERM, then
// SIGKILL) and removes the directory. The child also dies with the thread that forked it
// (PR_SET_PDEATHSIG), so a test program that crashes leaves no etcd behind.
//
// A test that needs etcd and finds no binary fails: setup.sh installs it, so its absence is a
// broken machine, not a reason to skip.
//
// EtcdEnvironment runs one EtcdServer for a whole test program (register it with
// ::testing::AddGlobalTestEnvironment); sharedEtcd() is that server while it runs.
#pragma once

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "rendezvous/etcd/etcd_client.h"
#include "store/address.h"
#include "tests/child_process.h"

namespace dlrun::test {

class EtcdServer {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";
  static constexpr std::chrono::seconds kStartTimeout{30};

  EtcdServer() = default;
  ~EtcdServer() { stop(); }
  EtcdServer(const EtcdServer&) = delete;
  EtcdServer& operator=(const EtcdServer&) = delete;

  // Throws std::runtime_error (with etcd's last log lines) when it does not answer in time.
  void start() {
    if (access(kBinary, X_OK) != 0) {
      throw std::runtime_error(std::string(kBinary) +
                               " is missing: run scripts/setup.sh (it installs etcd-server)");
    }
    char pattern[] = "/tmp/dlrun-etcd-XXXXXX";
    if (!mkdtemp(pattern)) throw std::runtime_error("mkdtemp failed");
    dir_ = pattern;
    const auto ports = reserveFreePorts("127.0.0.1", 2);
    clientPort_ = ports.at(0);
    const std::string client = "http://127.0.0.1:" + std::to_string(ports.at(0));
    const std::string peer = "http://127.0.0.1:" + std::to_string(ports.at(1));
    std::vector<std::string> args = {
        kBinary,
        "--name=default",
        "--data-dir=" + dir_ + "/data",
        "--listen-client-urls=" + client,
        "--advertise-client-urls=" + client,
        "--listen-peer-urls=" + peer,
        "--initial-advertise-peer-urls=" + peer,
        "--initial-cluster=default=" + peer,
        "--initial-cluster-token=dlrun-test-" + std::to_string(getpid()),
    };
    const std::string log = dir_ + "/etcd.log";
    pid_ = spawnLogged(std::move(args), log);
    const auto deadline = Clock::now() + kStartTimeout;
    while (true) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        throw std::runtime_error("etcd exited at start: " + logTail());
      }
      try {
        rendezvous::etcd::EtcdClient probe({.endpoints = endpoints(),
                                            .timeout = std::chrono::seconds(2),
                                            .connectTimeout = std::chrono::milliseconds(500)});
        probe.range("probe");
        return;
      } catch (const std::exception&) {
        if (Clock::now() >= deadline) {
          throw std::runtime_error("etcd did not answer within 30 s: " + logTail());
        }
      }
    }
  }

  // SIGTERM, up to 5 s, then SIGKILL; then the directory goes. Safe to call twice.
  void stop() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      const auto deadline = Clock::now() + std::chrono::seconds(5);
      int status = 0;
      while (waitpid(pid_, &status, WNOHANG) == 0) {
        if (Clock::now() >= deadline) {
          kill(pid_, SIGKILL);
          waitpid(pid_, &status, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      pid_ = -1;
    }
    if (!dir_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(dir_, ignored);
      dir_.clear();
    }
  }

  std::vector<rendezvous::etcd::Endpoint> endpoints() const { return {{"127.0.0.1", clientPort_}}; }
  uint16_t clientPort() const { return clientPort_; }
  pid_t pid() const { return pid_; }

  // How many requests etcd has started, by gRPC method ("Txn", "Watch"...): its /metrics page,
  // over a plain HTTP/1.0 GET on the client port. What a protocol costs etcd, for tests of it.
  std::map<std::string, int64_t> requestsStarted() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(clientPort_);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      ::close(fd);
      throw std::runtime_error("cannot reach etcd's /metrics");
    }
    const std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
    if (::write(fd, request.data(), request.size()) != static_cast<ssize_t>(request.size())) {
      ::close(fd);
      throw std::runtime_error("cannot ask etcd for /metrics");
    }
    std::string page;
    char buffer[65536];
    for (ssize_t n; (n = ::read(fd, buffer, sizeof buffer)) > 0;) page.append(buffer, n);
    ::close(fd);
    std::map<std::string, int64_t> started;
    std::istringstream lines(page);
    const std::string metric = "grpc_server_started_total{grpc_method=\"";
    for (std::string line; std::getline(lines, line);) {
      if (!line.starts_with(metric)) continue;
      const auto method = line.substr(metric.size(), line.find('"', metric.size()) - metric.size());
      started[method] += std::stoll(line.substr(line.rfind(' ') + 1));
    }
    return started;
  }

 private:
  std::string logTail() const {
    std::ifstream in(dir_ + "/etcd.log");
    std::string line, last;
    while (std::getline(in, line)) last = line;
    return last.empty() ? "(no log)" : last;
  }

  std::string dir_;
  uint16_t clientPort_ = 0;
  pid_t pid_ = -1;
};

inline EtcdServer*& sharedEtcdSlot() {
  static EtcdServer* server = nullptr;
  return server;
}
// The program's etcd; nullptr when it did not start (the environment failed the program then).
inline EtcdServer* sharedEtcd() { return sharedEtcdSlot(); }

class EtcdEnvironment : public ::testing::Environment {
 public:
  // `needed`: false in a helper process (one that a test starts to play a node), which talks
  // to its parent's etcd.
  explicit EtcdEnvironment(bool needed = true) : needed_(needed) {}
  void SetUp() override {
    if (!needed_) return;
    try {
      etcd_.start();
      sharedEtcdSlot() = &etcd_;
    } catch (const std::exception& error) {
      FAIL() << "cannot start etcd: " << error.what();
    }
  }
  void TearDown() override {
    sharedEtcdSlot() = nullptr;
    etcd_.stop();
  }

 private:
  const bool needed_;
  EtcdServer etcd_;
};

}  // namespace dlrun::test
