// The rendezvous simulation's command line (tests/sim/): runs a range of seeds, or replays one.
//   rendezvous_sim --schedules N [--first-seed S]   N schedules from seed S; exit 1 at the first
//                                                    broken invariant, with its seed, the command
//                                                    that replays it and its trace
//   rendezvous_sim --seed S [--trace]                one schedule, its verdict and digest (and
//   trace)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/sim/sim_job.h"

namespace {

void printTrace(const dlrun::sim::Verdict& verdict) {
  for (const auto& line : verdict.trace) std::printf("  %s\n", line.c_str());
}

int replay(uint64_t seed, bool trace, const char* self) {
  const auto verdict = dlrun::sim::runSchedule(seed, trace);
  if (trace) printTrace(verdict);
  std::printf("seed %llu: %s\n  %s\n  digest %016llx\n", static_cast<unsigned long long>(seed),
              verdict.ok ? "every invariant holds" : ("BROKEN: " + verdict.violation).c_str(),
              verdict.summary.c_str(), static_cast<unsigned long long>(verdict.digest));
  (void)self;
  return verdict.ok ? 0 : 1;
}

int sweep(uint64_t first, uint64_t count, const char* self) {
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t seed = first; seed < first + count; ++seed) {
    const auto verdict = dlrun::sim::runSchedule(seed, false);
    if (verdict.ok) continue;
    // The same seed again, with its trace: a schedule replays bit for bit, or the simulation
    // itself is broken.
    const auto again = dlrun::sim::runSchedule(seed, true);
    printTrace(again);
    std::printf("seed %llu BROKE AN INVARIANT: %s\n  %s\n  replay: %s --seed %llu --trace\n",
                static_cast<unsigned long long>(seed), verdict.violation.c_str(),
                verdict.summary.c_str(), self, static_cast<unsigned long long>(seed));
    if (again.digest != verdict.digest)
      std::printf("  and the replay differs (digest %016llx, then %016llx): not deterministic\n",
                  static_cast<unsigned long long>(verdict.digest),
                  static_cast<unsigned long long>(again.digest));
    return 1;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "%llu schedules (seeds %llu to %llu) in %.1f s, %.0f a second: every invariant "
      "holds\n",
      static_cast<unsigned long long>(count), static_cast<unsigned long long>(first),
      static_cast<unsigned long long>(first + count - 1), seconds, count / seconds);
  return 0;
}

uint64_t number(const char* flag, const char* text) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (text[0] == '\0' || text[0] == '-' || *end != '\0') {
    std::fprintf(stderr, "rendezvous_sim: %s wants a non-negative integer, not '%s'\n", flag, text);
    std::exit(2);
  }
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t first = 1, count = 0, seed = 0;
  bool one = false, trace = false;
  for (int i = 1; i < argc; ++i) {
    const bool hasValue = i + 1 < argc;
    if (!std::strcmp(argv[i], "--trace")) {
      trace = true;
    } else if (!std::strcmp(argv[i], "--seed") && hasValue) {
      seed = number("--seed", argv[++i]);
      one = true;
    } else if (!std::strcmp(argv[i], "--schedules") && hasValue) {
      count = number("--schedules", argv[++i]);
    } else if (!std::strcmp(argv[i], "--first-seed") && hasValue) {
      first = number("--first-seed", argv[++i]);
    } else {
      std::fprintf(stderr,
                   "rendezvous_sim: unknown or incomplete argument '%s'; usage: rendezvous_sim "
                   "--schedules N [--first-seed S] | --seed S [--trace]\n",
                   argv[i]);
      return 2;
    }
  }
  if (one) return replay(seed, trace, argv[0]);
  if (count == 0) {
    std::fprintf(stderr, "rendezvous_sim: say --schedules N or --seed S\n");
    return 2;
  }
  return sweep(first, count, argv[0]);
}
