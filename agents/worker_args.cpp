#include "agents/worker_args.h"

#include <cctype>
#include <string_view>

namespace dlrun::agents {
namespace {

// Python's Template idpattern: [_a-z][_a-z0-9]*, case-insensitively.
size_t identifierLength(std::string_view text) {
  size_t n = 0;
  auto ascii = [](char c) { return static_cast<unsigned char>(c) < 0x80; };
  while (n < text.size() && ascii(text[n]) &&
         (text[n] == '_' || std::isalpha(static_cast<unsigned char>(text[n])) ||
          (n > 0 && std::isdigit(static_cast<unsigned char>(text[n])))))
    ++n;
  return n;
}

}  // namespace

std::string substituteLocalRank(const std::string& arg, int localRank) {
  constexpr std::string_view kName = "local_rank";
  const std::string value = std::to_string(localRank);
  std::string out;
  out.reserve(arg.size());
  for (size_t at = 0; at < arg.size();) {
    const size_t dollar = arg.find('$', at);
    out.append(arg, at, dollar == std::string::npos ? std::string::npos : dollar - at);
    if (dollar == std::string::npos) break;
    const std::string_view rest = std::string_view(arg).substr(dollar + 1);
    if (rest.starts_with('$')) {  // $$: a dollar sign
      out += '$';
      at = dollar + 2;
    } else if (rest.starts_with('{') && rest.substr(1).starts_with(kName) &&
               rest.substr(1 + kName.size()).starts_with('}')) {
      out += value;
      at = dollar + 1 + kName.size() + 2;
    } else if (identifierLength(rest) == kName.size() && rest.starts_with(kName)) {
      out += value;
      at = dollar + 1 + kName.size();
    } else {  // another name, or none: kept as written
      out += '$';
      at = dollar + 1;
    }
  }
  return out;
}

std::vector<std::string> workerArgv(const std::vector<std::string>& command, int localRank,
                                    const std::string& localRankFlag, int flagValue) {
  std::vector<std::string> argv;
  argv.reserve(command.size() + 1);
  for (size_t i = 0; i < command.size(); ++i)
    argv.push_back(i == 0 ? command[i] : substituteLocalRank(command[i], localRank));
  if (!localRankFlag.empty()) argv.push_back(localRankFlag + "=" + std::to_string(flagValue));
  return argv;
}

}  // namespace dlrun::agents
