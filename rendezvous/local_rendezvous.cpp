#include "rendezvous/local_rendezvous.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "rendezvous/tcp_stream.h"

namespace dlrun::rendezvous {
std::vector<uint16_t> reserveFreePorts(const std::string& host, int count) {
  sockaddr_storage address{};
  socklen_t length = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&address);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&address);
  if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    length = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    length = sizeof(sockaddr_in6);
  } else {
    throw Error("cannot reserve ports: '" + host + "' is not a numeric address");
  }
  std::vector<int> held;
  std::vector<uint16_t> ports;
  auto release = [&] {
    for (int fd : held) ::close(fd);
  };
  for (int i = 0; i < count; ++i) {
    int fd = ::socket(address.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_storage bound = address;
    socklen_t boundLength = length;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&bound), length) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &boundLength) != 0) {
      const std::string reason = std::strerror(errno);
      if (fd >= 0) ::close(fd);
      release();
      throw Error("cannot reserve a free port on " + host + ": " + reason);
    }
    held.push_back(fd);
    ports.push_back(ntohs(address.ss_family == AF_INET
                              ? reinterpret_cast<sockaddr_in*>(&bound)->sin_port
                              : reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port));
  }
  release();
  return ports;
}

JoinResult LocalRendezvous::next() {
  World world;
  world.runId = options_.runId;
  world.round = round_++;
  world.localWorldSize = options_.localWorldSize;
  world.worldSize = options_.localWorldSize;
  world.masterAddr = options_.storeAddr;
  world.masterPort = options_.storePort;
  for (uint16_t port : reserveFreePorts(options_.hostAddr, options_.localWorldSize))
    world.workerEndpoints.push_back(joinHostPort(options_.hostAddr, port));
  return world;
}

}  // namespace dlrun::rendezvous
