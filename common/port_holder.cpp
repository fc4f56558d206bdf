#include "common/port_holder.h"

#include <filesystem>
#include <fstream>
#include <sstream>

namespace dlrun {
namespace fs = std::filesystem;

std::optional<uint64_t> listeningInode(std::string_view table, uint16_t port) {
  constexpr std::string_view kListen = "0A";  // the kernel's TCP_LISTEN, in hex
  std::istringstream lines{std::string(table)};
  std::string line;
  std::getline(lines, line);  // the header
  while (std::getline(lines, line)) {
    // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout;
    uint64_t inode = 0;
    if (!(fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >>
          timeout >> inode))
      continue;
    const size_t colon = local.rfind(':');
    if (state != kListen || colon == std::string::npos || inode == 0) continue;
    try {
      if (std::stoul(local.substr(colon + 1), nullptr, 16) == port) return inode;
    } catch (const std::exception&) {
    }
  }
  return std::nullopt;
}

std::optional<std::string> portHolder(uint16_t port) {
  std::optional<uint64_t> inode;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::stringstream text;
    text << in.rdbuf();
    if ((inode = listeningInode(text.str(), port))) break;
  }
  if (!inode) return std::nullopt;
  const std::string target = "socket:[" + std::to_string(*inode) + "]";
  std::error_code ec;
  for (const auto& process : fs::directory_iterator("/proc", ec)) {
    const std::string pid = process.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    for (const auto& fd : fs::directory_iterator(process.path() / "fd", ec)) {
      if (fs::read_symlink(fd.path(), ec).string() != target) continue;
      std::string name;
      std::getline(std::ifstream(process.path() / "comm"), name);
      return "PID " + pid + (name.empty() ? "" : ", " + name);
    }
    ec.clear();  // another user's process: its descriptors are not ours to read
  }
  return std::nullopt;
}

}  // namespace dlrun
