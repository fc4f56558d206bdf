#include "store/address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <utility>

#include "common/error.h"

namespace dlrun {
namespace {

using AddrInfoList = std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)>;

// getaddrinfo's answer (empty where it failed) and its code.
std::pair<AddrInfoList, int> askResolver(const std::string& host, uint16_t port, int socktype) {
  addrinfo hints{};
  hints.ai_socktype = socktype;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
  return {AddrInfoList(rc == 0 ? list : nullptr, &::freeaddrinfo), rc};
}

std::string cannotResolve(const std::string& what, const std::string& host, int rc) {
  return "cannot resolve " + what + " '" + host + "': " + ::gai_strerror(rc);
}

AddrInfoList lookUp(const std::string& host, uint16_t port, int socktype, const std::string& what) {
  auto [list, rc] = askResolver(host, port, socktype);
  if (!list) throw NetworkError(cannotResolve(what, host, rc));
  return std::move(list);
}

std::string numeric(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* bytes =
      address->sa_family == AF_INET
          ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(address)->sin_addr)
          : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr);
  ::inet_ntop(address->sa_family, bytes, text, sizeof(text));
  return text;
}

}  // namespace

std::string resolveNumeric(const std::string& host, const std::string& what) {
  return numeric(lookUp(host, 0, SOCK_STREAM, what)->ai_addr);
}

std::string resolveNumericWaiting(const std::string& host, const std::string& what,
                                  Clock::time_point deadline,
                                  const std::function<void(const std::string&)>& waiting) {
  std::chrono::milliseconds pause(50);
  std::minstd_rand random(std::random_device{}());
  for (bool said = false;; said = true) {
    const auto [list, rc] = askResolver(host, 0, SOCK_STREAM);
    if (list) return numeric(list->ai_addr);
    const bool notYet = rc == EAI_NONAME || rc == EAI_AGAIN || rc == EAI_FAIL
#ifdef EAI_NODATA
                        || rc == EAI_NODATA
#endif
        ;
    const auto left = deadline - Clock::now();
    if (!notYet || left <= Clock::duration::zero())
      throw NetworkError(cannotResolve(what, host, rc) +
                         (notYet && said ? " (tried until the rendezvous timeout)" : ""));
    if (!said) waiting(::gai_strerror(rc));
    // Jittered, so the pods of a job that started together do not ask the resolver in step.
    std::this_thread::sleep_for(
        std::min<Clock::duration>(pause * (50 + random() % 51) / 100, left));
    pause = std::min<std::chrono::milliseconds>(pause * 2, std::chrono::seconds(2));
  }
}

std::string localAddressToward(const std::string& host, uint16_t port) {
  const AddrInfoList list = lookUp(host, port, SOCK_DGRAM, "the address");
  // Connecting a UDP socket only picks the route; nothing is sent.
  const int fd = ::socket(list->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  const bool ok = fd >= 0 && ::connect(fd, list->ai_addr, list->ai_addrlen) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0;
  const int error = errno;
  if (fd >= 0) ::close(fd);
  if (!ok) throw NetworkError("no route to '" + host + "': " + std::strerror(error));
  return numeric(reinterpret_cast<const sockaddr*>(&local));
}

bool isLocalAddress(const std::string& address) {
  const AddrInfoList list = lookUp(address, 0, SOCK_STREAM, "the address");
  const int fd = ::socket(list->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool local = fd >= 0 && ::bind(fd, list->ai_addr, list->ai_addrlen) == 0;
  if (fd >= 0) ::close(fd);
  return local;
}

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

}  // namespace dlrun
