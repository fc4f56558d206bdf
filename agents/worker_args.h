// Each worker's argv from the job's command (pure): torchrun's `${local_rank}` macro in the
// arguments, and --use-local-rank-arg's flag appended.
#pragma once

#include <string>
#include <vector>

namespace dlrun::agents {

// `arg` with `$local_rank` and `${local_rank}` replaced by `localRank` and `$$` by `$`, the rest
// as written: Python's string.Template.safe_substitute with that one name, as torch's agent
// substitutes every worker argument.
std::string substituteLocalRank(const std::string& arg, int localRank);

// `command` (argv[0] as it is, each argument substituted), then `localRankFlag=N` where the
// flag is not empty (N: `flagValue`, 0 under --virtual-local-rank).
std::vector<std::string> workerArgv(const std::vector<std::string>& command, int localRank,
                                    const std::string& localRankFlag, int flagValue);

}  // namespace dlrun::agents
