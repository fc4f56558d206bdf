#include "rendezvous/address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "common/error.h"

namespace dlrun::rendezvous {
namespace {

using AddrInfoList = std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)>;

AddrInfoList lookUp(const std::string& host, uint16_t port, int socktype,
                    const std::string& what) {
  addrinfo hints{};
  hints.ai_socktype = socktype;
  addrinfo* list = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
  if (rc != 0 || !list)
    throw NetworkError("cannot resolve " + what + " '" + host + "': " + ::gai_strerror(rc));
  return {list, &::freeaddrinfo};
}

std::string numeric(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* bytes = address->sa_family == AF_INET
                          ? static_cast<const void*>(
                                &reinterpret_cast<const sockaddr_in*>(address)->sin_addr)
                          : static_cast<const void*>(
                                &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr);
  ::inet_ntop(address->sa_family, bytes, text, sizeof(text));
  return text;
}

}  // namespace

std::string resolveNumeric(const std::string& host, const std::string& what) {
  return numeric(lookUp(host, 0, SOCK_STREAM, what)->ai_addr);
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

}  // namespace dlrun::rendezvous
