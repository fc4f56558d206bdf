#include "trainer/traffic.h"

#include <dirent.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "common/text.h"

namespace dlrun::trainer {

Traffic tcpTraffic() {
  Traffic total;
  DIR* fds = ::opendir("/proc/self/fd");
  if (fds == nullptr) return total;
  while (const dirent* entry = ::readdir(fds)) {
    const auto fd = parseInteger<int>(entry->d_name);  // nullopt for "." and ".."
    struct stat st {};
    if (!fd || ::fstat(*fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    tcp_info info{};
    socklen_t size = sizeof(info);
    // Not a TCP socket (the directory's own descriptor, Unix sockets): refused, skipped.
    if (::getsockopt(*fd, IPPROTO_TCP, TCP_INFO, &info, &size) != 0) continue;
    total.sent += info.tcpi_bytes_acked;
    total.received += info.tcpi_bytes_received;
  }
  ::closedir(fds);
  return total;
}

}  // namespace dlrun::trainer
