// The deterministic simulation's core: one thread, a virtual clock, a seeded generator, events
// in time order, and tasks: blocking code (the production rendezvous) run as fibers, each of
// which yields to the scheduler wherever it would block. Which runnable task goes next, and
// every latency and fault, come from the seed alone, so a seed replays a schedule bit for bit.
#pragma once

#include <ucontext.h>

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/clock.h"

namespace dlrun::sim {

using namespace std::chrono_literals;
using Time = Clock::time_point;
using Duration = std::chrono::milliseconds;

// Thrown at the next step of a task whose owner (an agent's process) was killed: it unwinds the
// task's stack. Not an Error, so the production code's handlers let it pass.
struct Killed {};

class Simulation {
 public:
  Simulation(uint64_t seed, bool keepTrace);
  ~Simulation();  // unwind()s
  // Unwinds every task still blocked, as if its owner were killed, so nothing leaks.
  void unwind();
  Simulation(const Simulation&) = delete;
  Simulation& operator=(const Simulation&) = delete;

  Time now() const { return now_; }
  // Seconds since the start, for traces and messages.
  double seconds(Time t) const;
  std::mt19937_64& random() { return random_; }
  int64_t uniform(int64_t lo, int64_t hi);  // inclusive
  Duration between(Duration lo, Duration hi) { return Duration(uniform(lo.count(), hi.count())); }
  bool chance(double p);

  // Runs `action` at `t` (not before now); equal times keep the order they were scheduled in.
  void at(Time t, std::function<void()> action);

  // Starts a task for `owner` (an agent's number, or -1 for none) at once.
  void spawn(int owner, std::function<void()> body);
  // In a task: blocks until `ready()` (nullptr: never) or `deadline`; returns whether ready.
  // Throws Killed once the owner was killed.
  bool block(const std::function<bool()>& ready, Time deadline = Time::max());
  void sleep(Duration d) { block(nullptr, now_ + d); }
  // In a task: its owner.
  int owner() const;

  // An owner stopped (SIGSTOP) until `until`: its tasks do not run meanwhile.
  void pauseOwner(int owner, Time until);
  bool paused(int owner) const;
  // An owner killed: each of its tasks throws Killed at its next step.
  void killOwner(int owner);
  bool killed(int owner) const;

  // Runs until nothing is left to do or `until` passes; returns whether it ran out of work.
  bool run(Time until);
  int liveTasks() const;

  // One line of the schedule: into the digest always, into the trace when kept.
  void note(const std::string& line);
  uint64_t digest() const { return digest_; }
  const std::vector<std::string>& trace() const { return trace_; }

 private:
  struct Task;
  struct Event {
    Time time;
    uint64_t seq;
    std::function<void()> action;
  };
  static void entry(unsigned low, unsigned high);
  void resume(Task& task);
  bool runnable(const Task& task) const;
  Time wakeTime(const Task& task) const;

  Time now_{};
  std::mt19937_64 random_;
  bool keepTrace_;
  uint64_t digest_ = 1469598103934665603ull;
  std::vector<std::string> trace_;
  uint64_t seq_ = 0;
  std::map<std::pair<Time, uint64_t>, std::function<void()>> events_;
  std::vector<std::unique_ptr<Task>> tasks_;
  Task* current_ = nullptr;
  std::exception_ptr failure_;
  ucontext_t scheduler_{};
  std::map<int, Time> pausedUntil_;
  std::vector<int> killed_;
  bool unwinding_ = false;  // the destructor's: every task is killed
};

}  // namespace dlrun::sim
