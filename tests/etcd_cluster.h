// A real 3-member etcd cluster for fail-over tests: three Debian /usr/bin/etcd processes on
// loopback, each with its own client and peer ports and temporary data directory, formed with
// --initial-cluster and a token unique to this process and cluster. start() waits (bounded, no
// fixed sleeps) until the cluster has a leader and a write through every member applies; the
// destructor stops every member still running by PID (SIGKILL) and removes the
// directories, also when start() threw. Each child dies with the thread that forked it
// (PR_SET_PDEATHSIG), so a crashed test program leaves no etcd behind.
//
// leader() asks Debian's etcdctl (`endpoint status -w json`: the Maintenance API is not in our
// proto); kill() SIGKILLs one member, as a machine that dies would go.
#pragma once

#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "rendezvous/etcd/etcd_client.h"
#include "store/address.h"
#include "tests/child_process.h"

namespace dlrun::test {

class EtcdCluster {
 public:
  static constexpr const char* kBinary = "/usr/bin/etcd";
  static constexpr const char* kCtl = "/usr/bin/etcdctl";
  static constexpr size_t kMembers = 3;
  static constexpr std::chrono::seconds kStartTimeout{30};

  EtcdCluster() = default;
  ~EtcdCluster() { stop(); }
  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // Throws std::runtime_error (with the members' last log lines) when the cluster does not
  // form in time. The caller's destructor still stops what did start.
  void start() {
    for (const char* binary : {kBinary, kCtl}) {
      if (access(binary, X_OK) != 0) {
        throw std::runtime_error(std::string(binary) +
                                 " is missing: run scripts/setup.sh (it installs etcd)");
      }
    }
    char pattern[] = "/tmp/dlrun-etcd-cluster-XXXXXX";
    if (!mkdtemp(pattern)) throw std::runtime_error("mkdtemp failed");
    dir_ = pattern;
    const auto ports = reserveFreePorts("127.0.0.1", 2 * kMembers);
    std::string initial;
    for (size_t i = 0; i < kMembers; ++i) {
      members_[i].clientPort = ports.at(2 * i);
      members_[i].peerPort = ports.at(2 * i + 1);
      if (!initial.empty()) initial += ",";
      initial += name(i) + "=" + peerUrl(i);
    }
    static std::atomic<int> clusters{0};
    const std::string token = "dlrun-test-" + std::to_string(getpid()) + "-" +
                              std::to_string(clusters++) + "-" + dir_.substr(dir_.size() - 6);
    for (size_t i = 0; i < kMembers; ++i) {
      spawn(i, {kBinary, "--name=" + name(i), "--data-dir=" + dir_ + "/" + name(i),
                "--listen-client-urls=" + clientUrl(i), "--advertise-client-urls=" + clientUrl(i),
                "--listen-peer-urls=" + peerUrl(i), "--initial-advertise-peer-urls=" + peerUrl(i),
                "--initial-cluster=" + initial, "--initial-cluster-state=new",
                "--initial-cluster-token=" + token});
    }
    // Ready: a leader is elected and every member serves a linearizable read.
    const auto deadline = Clock::now() + kStartTimeout;
    for (size_t i = 0; i < kMembers; ++i) {
      while (true) {
        int status = 0;
        if (waitpid(members_[i].pid, &status, WNOHANG) == members_[i].pid) {
          members_[i].pid = -1;
          throw std::runtime_error(name(i) + " exited at start: " + logTail(i));
        }
        try {
          rendezvous::etcd::EtcdClient probe({.endpoints = {endpoint(i)},
                                              .timeout = std::chrono::seconds(2),
                                              .connectTimeout = std::chrono::milliseconds(500)});
          probe.range("probe");
          break;
        } catch (const std::exception&) {
          if (Clock::now() >= deadline) {
            throw std::runtime_error("the etcd cluster did not form within 30 s: " + logTail(i));
          }
        }
      }
    }
  }

  // SIGKILL for every member still running, reaped; then the directory goes. Not SIGTERM: a
  // member stopping gracefully hands its leadership on and waits for peers that are stopping
  // too (seconds each), and the data is thrown away anyway. Safe to call twice.
  void stop() {
    for (size_t i = 0; i < kMembers; ++i) kill(i);
    if (!dir_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(dir_, ignored);
      dir_.clear();
    }
  }

  // SIGKILLs member `i` and reaps it: it is gone when this returns.
  void kill(size_t i) {
    auto& pid = members_.at(i).pid;
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
  }
  bool running(size_t i) const { return members_.at(i).pid > 0; }

  // The member whose client endpoint is `text` ("127.0.0.1:port"), if any.
  std::optional<size_t> memberAt(const std::string& text) const {
    for (size_t i = 0; i < kMembers; ++i) {
      if (endpoint(i).text() == text) return i;
    }
    return std::nullopt;
  }

  // The leader as the running members report it; nullopt when they report none (or disagree)
  // by `timeout`. Polls etcdctl, which answers in milliseconds on loopback.
  std::optional<size_t> leader(std::chrono::milliseconds timeout = std::chrono::seconds(10)) const {
    const auto deadline = Clock::now() + timeout;
    while (true) {
      if (auto found = askLeader()) return found;
      if (Clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // Compacts the history up to `revision` through etcdctl (our proto has no Compact); true
  // when etcdctl succeeded.
  bool compact(int64_t revision) const {
    std::string list;
    for (size_t i = 0; i < kMembers; ++i) {
      if (!running(i)) continue;
      if (!list.empty()) list += ",";
      list += endpoint(i).text();
    }
    const std::string command = std::string("ETCDCTL_API=3 ") + kCtl +
                                " --dial-timeout=1s --command-timeout=5s --endpoints=" + list +
                                " compact " + std::to_string(revision) + " >/dev/null 2>&1";
    return std::system(command.c_str()) == 0;
  }

  rendezvous::etcd::Endpoint endpoint(size_t i) const {
    return {"127.0.0.1", members_.at(i).clientPort};
  }
  std::vector<rendezvous::etcd::Endpoint> endpoints() const {
    std::vector<rendezvous::etcd::Endpoint> all;
    for (size_t i = 0; i < kMembers; ++i) all.push_back(endpoint(i));
    return all;
  }
  // The endpoints with member `first` put first, so a client picks it when it is up (the list's
  // order breaks ties between endpoints that connect together).
  std::vector<rendezvous::etcd::Endpoint> endpointsFrom(size_t first) const {
    std::vector<rendezvous::etcd::Endpoint> all{endpoint(first)};
    for (size_t i = 0; i < kMembers; ++i) {
      if (i != first) all.push_back(endpoint(i));
    }
    return all;
  }

 private:
  struct Member {
    uint16_t clientPort = 0;
    uint16_t peerPort = 0;
    pid_t pid = -1;
  };

  static std::string name(size_t i) { return "m" + std::to_string(i); }
  std::string clientUrl(size_t i) const {
    return "http://127.0.0.1:" + std::to_string(members_[i].clientPort);
  }
  std::string peerUrl(size_t i) const {
    return "http://127.0.0.1:" + std::to_string(members_[i].peerPort);
  }

  void spawn(size_t i, std::vector<std::string> args) {
    const std::string log = dir_ + "/" + name(i) + ".log";
    const pid_t pid = spawnLogged(std::move(args), log);
    members_[i].pid = pid;
  }

  // One etcdctl call on the running members: the leader's index when they all name the same
  // member and it is one of ours.
  std::optional<size_t> askLeader() const {
    std::string list;
    for (size_t i = 0; i < kMembers; ++i) {
      if (!running(i)) continue;
      if (!list.empty()) list += ",";
      list += endpoint(i).text();
    }
    if (list.empty()) return std::nullopt;
    const std::string command = std::string("ETCDCTL_API=3 ") + kCtl +
                                " --dial-timeout=1s --command-timeout=2s --endpoints=" + list +
                                " endpoint status -w json 2>/dev/null";
    FILE* pipe = popen(command.c_str(), "r");
    if (!pipe) return std::nullopt;
    std::string out;
    std::array<char, 4096> buffer{};
    size_t got = 0;
    while ((got = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) out.append(buffer.data(), got);
    pclose(pipe);
    // [{"Endpoint":"127.0.0.1:P","Status":{"header":{...,"member_id":M,...},...,"leader":L,...}}]
    std::optional<uint64_t> leaderId;
    std::optional<size_t> leaderIndex;
    size_t answered = 0;
    for (size_t at = out.find("\"Endpoint\":\""); at != std::string::npos;
         at = out.find("\"Endpoint\":\"", at + 1)) {
      const size_t start = at + 12;
      const std::string text = out.substr(start, out.find('"', start) - start);
      const auto member = number(out, "\"member_id\":", at);
      const auto leads = number(out, "\"leader\":", at);
      if (!member || !leads || *leads == 0) return std::nullopt;
      if (leaderId && *leaderId != *leads) return std::nullopt;  // not settled yet
      leaderId = leads;
      if (*member == *leads) leaderIndex = memberAt(text);
      ++answered;
    }
    if (answered == 0) return std::nullopt;
    return leaderIndex;
  }

  // The unsigned number after `label`, searched from `from`.
  static std::optional<uint64_t> number(const std::string& text, const std::string& label,
                                        size_t from) {
    const size_t at = text.find(label, from);
    if (at == std::string::npos) return std::nullopt;
    size_t i = at + label.size();
    uint64_t value = 0;
    bool any = false;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
      value = value * 10 + static_cast<uint64_t>(text[i++] - '0');
      any = true;
    }
    return any ? std::optional<uint64_t>(value) : std::nullopt;
  }

  std::string logTail(size_t i) const {
    std::ifstream in(dir_ + "/" + name(i) + ".log");
    std::string line, last;
    while (std::getline(in, line)) last = line;
    return name(i) + ": " + (last.empty() ? "(no log)" : last);
  }

  std::string dir_;
  std::array<Member, kMembers> members_{};
};

}  // namespace dlrun::test
