// The parameter servers' wire (--strategy ps): a request is a Header then its payload, raw
// little-endian; every request gets one reply, a Header (same op) then its payload.
//
//   op     request payload                         reply payload
//   Init   Position, params, velocity (its shard)  -        (kept only by a server not yet set)
//   Hello  -                                       Position (the worker's last), params
//   Push   float lr, Position, gradient            params (async at once; --ps-sync once
//                                                  every worker pushed its step)
//   State  -                                       params, velocity
//   Done   -                                       -        (the server exits after all)
//
// Vectors are the server's shard of the flat parameter vector, float32. Position is where the
// worker stands after the step (what a restarted worker resumes from).
#pragma once

#include <cstdint>

namespace dlrun::trainer::ps {

enum class Op : uint32_t { Init = 1, Hello = 2, Push = 3, State = 4, Done = 5 };

struct Header {
  uint32_t op = 0;
  uint32_t worker = 0;  // the sender's index among the trainers (PsPlace::index)
  uint64_t bytes = 0;   // of the payload that follows
};

struct Position {
  int64_t epoch = 0;
  int64_t samplesInEpoch = 0;  // global samples of that epoch done
  int64_t step = 0;
};

static_assert(sizeof(Header) == 16 && sizeof(Position) == 24);

}  // namespace dlrun::trainer::ps
