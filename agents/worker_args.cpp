#include "agents/worker_args.h"

#include "common/text.h"

namespace dlrun::agents {

std::string substituteLocalRank(const std::string& arg, int localRank) {
  return substituteTemplate(arg, {{"local_rank", std::to_string(localRank)}});
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
