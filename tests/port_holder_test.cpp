// common/port_holder.h: who listens on a port, from /proc.
#include "common/port_holder.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace dlrun {
namespace {

// Two lines of a real /proc/net/tcp: a listener on port 29500 (0x733C), a connection from it.
constexpr const char* kTable =
    "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout "
    "inode\n"
    "   0: 0100007F:733C 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 "
    "4711 1 0000000000000000 100 0 0 10 0\n"
    "   1: 0100007F:733C 0100007F:D3F2 01 00000000:00000000 00:00000000 00000000     0        0 "
    "4712 1 0000000000000000 20 4 30 10 -1\n";

TEST(ListeningInode, TheListenerOfThePortNotItsConnections) {
  EXPECT_EQ(listeningInode(kTable, 29500), 4711u);
  EXPECT_EQ(listeningInode(kTable, 29501), std::nullopt);
  EXPECT_EQ(listeningInode("", 29500), std::nullopt);
  EXPECT_EQ(listeningInode("header\nnot a table line\n", 29500), std::nullopt);
}

TEST(PortHolder, NamesThisProcessForAPortItListensOn) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), length), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const uint16_t port = ntohs(address.sin_port);
  std::string comm;
  std::getline(std::ifstream("/proc/self/comm"), comm);
  EXPECT_EQ(portHolder(port), "PID " + std::to_string(::getpid()) + ", " + comm);
  ::close(fd);
  EXPECT_EQ(portHolder(port), std::nullopt);  // nobody listens there now
}

}  // namespace
}  // namespace dlrun
