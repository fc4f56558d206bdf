// Ten thousand idle connections cost the server little and do not slow other clients. The
// connections live in a child process: one process may hold at most 20,000 descriptors here.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>

#include "store/store_server.h"
#include "store/tcp_store.h"
#include "tests/store_test_util.h"

namespace dlrun::rendezvous {
namespace {

using namespace std::chrono_literals;

constexpr int kIdle = 10'000;

void raiseDescriptorLimit() {
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  limit.rlim_cur = limit.rlim_max;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &limit), 0);
  ASSERT_GE(limit.rlim_cur, static_cast<rlim_t>(kIdle + 100)) << "descriptor limit too low";
}

long residentKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// The child: reads the port, opens kIdle connections, proves each is served with one PING,
// reports readiness and then holds them all, idle, until the parent closes `release`.
[[noreturn]] void holdIdleConnections(int portPipe, int readyPipe, int releasePipe) {
  int status = 1;
  try {
    uint16_t port = 0;
    if (read(portPipe, &port, sizeof(port)) != sizeof(port)) _exit(3);
    rlimit limit{};
    getrlimit(RLIMIT_NOFILE, &limit);
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
    std::vector<testing::RawClient> clients;
    clients.reserve(kIdle);
    std::string ping;
    wire::Encoder(ping).op(wire::Era::V2, wire::Op::Ping).u32(0xABCD);
    for (int i = 0; i < kIdle; ++i) {
      clients.emplace_back(port);
      clients.back().validate();
      clients.back().send(ping);
    }
    for (auto& c : clients) {
      if (c.read(4) != std::string("\xCD\xAB\0\0", 4)) _exit(4);
    }
    char ready = 'r';
    if (write(readyPipe, &ready, 1) != 1) _exit(5);
    char ignored;
    [[maybe_unused]] auto n = read(releasePipe, &ignored, 1);  // returns 0 when released
    status = 0;
  } catch (...) {
    status = 2;
  }
  _exit(status);
}

TEST(IdleConnections, TenThousandIdleWhileAnotherClientIsServed) {
  raiseDescriptorLimit();
  int portPipe[2], readyPipe[2], releasePipe[2];
  ASSERT_EQ(pipe(portPipe), 0);
  ASSERT_EQ(pipe(readyPipe), 0);
  ASSERT_EQ(pipe(releasePipe), 0);
  // Fork before the server thread starts, so the child inherits a single-threaded process.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(portPipe[1]);
    close(readyPipe[0]);
    close(releasePipe[1]);
    holdIdleConnections(portPipe[0], readyPipe[1], releasePipe[0]);
  }
  close(portPipe[0]);
  close(readyPipe[1]);
  close(releasePipe[0]);
  struct Reaper {  // stops the child by PID however the test ends
    pid_t pid;
    int release;
    ~Reaper() {
      close(release);
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } reaper{child, releasePipe[1]};

  const long before = residentKiB();
  StoreServerThread server({.listen = {"127.0.0.1", 0}});
  const uint16_t port = server.port();
  ASSERT_EQ(write(portPipe[1], &port, sizeof(port)), static_cast<ssize_t>(sizeof(port)));
  char ready = 0;
  ASSERT_EQ(read(readyPipe[0], &ready, 1), 1) << "the child could not open its connections";
  EXPECT_EQ(server.connectionCount(), static_cast<size_t>(kIdle));

  TcpStore store({.at = {"127.0.0.1", port}, .timeout = 10s});
  for (int i = 0; i < 1000; ++i) store.add("busy", 1);
  EXPECT_EQ(store.get("busy"), "1000");
  EXPECT_EQ(server.connectionCount(), static_cast<size_t>(kIdle + 1));

  const long grownKiB = residentKiB() - before;
  std::cout << "server memory for " << kIdle << " idle connections: " << grownKiB / 1024
            << " MiB\n";
  EXPECT_LT(grownKiB, 64 * 1024) << "idle connections should cost a few KiB each";
}

}  // namespace
}  // namespace dlrun::rendezvous
