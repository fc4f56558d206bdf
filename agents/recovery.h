// In-process recovery (--recovery=in-process; docs/guides/in-process-recovery.md): what the
// agent and dlrun.recovery (python/dlrun/recovery.py) agree on, and when a failed worker is
// started again alone rather than with its whole group.
//
// Each worker's loop, once its process group is formed (or re-formed, in a replacement), writes
// its mark to DLRUN_RECOVERY_DIR/LOCAL_RANK: one JSON object, {"pid": ..., "generation": ...},
// and in a replacement its recovery's end ("at", unix seconds) and phases ("phases": leave, meet,
// group, state, total, in seconds, as Loop.last_recovery); past the loop's last barrier, "done";
// in a survivor whose collective failed, until it recovered, "recovering".
// A failed worker is replaced alone only if it had marked (its program recovers in process), had
// not left the loop, and no replacement of this node is still recovering (its mark not yet its
// own): a second failure during a recovery restarts the group. One exit is not such a failure: a
// survivor whose old group would not close (kReplaceCode, before it met the new generation) is
// replaced alone even then; its replacement meets the same generation in its place.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dlrun {
class Store;
}

namespace dlrun::agents::recovery {

// The exit code with which a loop that cannot finish a recovery asks for the whole-group
// restart: sysexits' EX_TEMPFAIL.
inline constexpr int kFallbackCode = 75;
inline constexpr std::string_view kDirVariable = "DLRUN_RECOVERY_DIR";
inline constexpr std::string_view kFallbackVariable = "DLRUN_RECOVERY_FALLBACK";
// The exit code with which a survivor asks to be replaced: its old process group did not close
// in time (on torch 2.13 a gloo collective still pending on a live peer holds it for the group's
// whole timeout, and that peer waits on it as long); its exit closes the sockets the peer waits
// on. It had not met the new generation yet, so its replacement can.
inline constexpr int kReplaceCode = 76;
inline constexpr std::string_view kReplaceVariable = "DLRUN_RECOVERY_REPLACE";
inline constexpr std::string_view kJoinVariable = "DLRUN_RECOVERY_JOIN";  // "1" in a replacement
// "1" in a replacement of a rank that a round kept through a re-rendezvous (a lost node): it
// looks for its predecessor's move before it meets (python/dlrun/recovery.py).
inline constexpr std::string_view kKeptVariable = "DLRUN_RECOVERY_KEPT";
// --ready-spares: "1" in a worker started ahead on a spare (agent_spares.cpp); the zygote makes
// it the descriptor over which the worker's place comes (python/dlrun/_reserve.py).
inline constexpr std::string_view kReserveVariable = "DLRUN_RECOVERY_RESERVE";

struct Mark {
  pid_t pid = 0;
  int generation = 0;
  double at = 0;  // a replacement's: when its recovery ended
  std::map<std::string, double> phases;
  bool done = false;        // the worker left the loop: no peer is left to meet a replacement
  bool recovering = false;  // a survivor whose collective failed, recovering
  // Its step's time in seconds as last marked (0 before its first step): it marks again when
  // a step takes more than half again as long, or less than half.
  double stepSeconds = 0;
};

// The mark of `localRank`, nothing when it has none (or an unreadable one).
std::optional<Mark> readMark(const std::filesystem::path& dir, int localRank);
// The pid in a worker's mark, 0 when it has none (or an unreadable one).
pid_t markedPid(const std::filesystem::path& dir, int localRank);
// Parses a mark's text (pure); nothing when it is not one.
std::optional<Mark> parseMark(const std::string& text);

// How long a lost node's survivors, kept, may take to see its failure before they are killed
// (pure): 2 s, and three times the step's time, beyond the round that keeps them: their step
// watch frees a rank at once then (its agent's move), and ends it to be replaced where it is
// still in that step twice its step's time later (a step as last marked may since be half again
// as long).
// `slowestStep`: the largest stepSeconds of their marks.
std::chrono::milliseconds keepGrace(double slowestStep);

// The event's line for rank `rank`'s replacement, started at `startedAt` (unix seconds, as its
// predecessor's failure was seen), whose mark says its recovery is done (pure).
std::string describeRecovery(int rank, const Mark& mark, double startedAt);

// What the agent knows of a failure, for the choice below (pure).
struct Failure {
  int exitCode = 0;               // the exit code, -1 for a signal
  bool marked = false;            // the failed process had marked
  bool done = false;              // and its mark says it had left the loop
  bool recoveringItself = false;  // and its mark says it was recovering (a survivor)
  // Local ranks whose replacement has not marked yet: their recovery is under way.
  std::vector<int> recovering;
};

// Why the failed worker is not replaced alone (the whole group restarts), or empty: replace it.
// A survivor that dies in its own recovery is not (unless it asked, exit kReplaceCode): after a
// lost node its replacement would meet where the kept round's ranks are not.
std::string refusal(const Failure& failure);

// The workers' keys in their store (recovery.py's KEYS), as the agent's client names them:
// torch's TCPStore client (1.13 as 2.x) puts "/" before every key. The last generation that
// formed, a counter; and what an agent tells its workers that round R kept (a node lost), for
// generation `generation` (the one after the last that formed, which they are meeting in): the
// world's size under `<g>/round<R>/`, where they meet again with the newcomers (started with
// kRoundVariable) and never with a lost node's workers that come back, then each rank's move,
// `<g>/move/<its rank>` = R * kMoveBase + its number in R + 1 (a counter the loop polls; a later
// round that keeps them again moves them again).
inline constexpr std::string_view kGenerationKey = "/dlrun/recovery/generation";
inline constexpr std::string_view kRoundVariable = "DLRUN_RECOVERY_ROUND";
inline constexpr int64_t kMoveBase = 1'000'000;  // recovery.py's MOVE_BASE: ranks stay below it
std::vector<std::pair<std::string, std::string>> moving(int generation, int round, int oldBaseRank,
                                                        int newBaseRank, int count, int worldSize);

// What wakes the loops meeting in generation `generation` (in its keys or a round's): news,
// once its cause is in the store (the meeting full, ranks moved, a rank out of the loop), is
// counted in newsKey, and the key of that count, `<news>/<count>`, set. A loop reads the count
// before it looks at the causes and then waits for the next count's key: no news is missed, and
// it waits in one request, not by polling (a store's WAIT is for all of its keys, not any).
inline std::string newsKey(int generation) {
  return "/dlrun/recovery/" + std::to_string(generation) + "/news";
}
void tellNews(Store& store, const std::string& news);

// The count of ranks arrived in generation `generation`'s own keys, whose existence the step
// watch of a rank still in a step of the generation before waits for (python/dlrun/_stuck.py):
// a peer moved on, so that step can never finish. An agent that keeps its workers (a node lost)
// creates it (an add of 0, so the count stays true) with their move keys as soon as it keeps
// them (moveKey), and again once its moves are set: a survivor in that step, which waits on a
// lost node (a silent one fails no collective; a killed one's connections close only once its
// memory is freed), is freed as soon as its move key is there (the watch looks for it through
// its grace, whoever arrived first).
inline std::string arrivedKey(int generation) {
  return "/dlrun/recovery/" + std::to_string(generation) + "/arrived";
}

// A rank's move counter in generation `generation` (see moving). Made at 0 (an add of 0: it names
// no round, and the loop reads it as no move) by an agent that keeps its workers as soon as the
// lost node's round ends, with arrivedKey: their step watches free them then (its existence says
// their step cannot end), not once the round that keeps them formed.
inline std::string moveKey(int generation, int rank) {
  return "/dlrun/recovery/" + std::to_string(generation) + "/move/" + std::to_string(rank);
}

}  // namespace dlrun::agents::recovery
