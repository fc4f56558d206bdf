// Where a process sits under --strategy ps (pure): its part (a parameter server or a worker)
// and index, read from TF_CONFIG as TensorFlow's cluster resolver reads it, and the contiguous
// range of the flat parameter vector each server holds.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace dlrun::trainer {

struct PsPlace {
  int servers = 1;  // the cluster's "ps" tasks
  int workers = 1;  // its "chief" and "worker" tasks: the ones that train
  bool server = false;
  // A server's ps index; a worker's place among the trainers: the chief 0, then worker i at
  // i + the number of chiefs, so worker 0 of the trainers is the chief (it checkpoints).
  int index = 0;
};

// From TF_CONFIG's text; throws ConfigError (one line) when it is missing, malformed, lists no
// ps or no worker, or names a task of another type or out of range.
PsPlace psPlaceFromTfConfig(const char* tfConfig);

struct ShardRange {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
  bool operator==(const ShardRange&) const = default;
};

// `servers` contiguous ranges covering [0, parameters), sizes differing by at most one, the
// larger first; throws ConfigError when a server would hold nothing.
std::vector<ShardRange> shardRanges(size_t parameters, int servers);

}  // namespace dlrun::trainer
