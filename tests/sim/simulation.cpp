#include "tests/sim/simulation.h"

#include <cxxabi.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>
#include <stdexcept>
#include <utility>

namespace dlrun::sim {

namespace {

// The thread's exception state (libstdc++'s __cxa_eh_globals: the exceptions being handled, and
// how many are in flight). Code that waits inside a catch block (the rendezvous rides out an
// outage in its handler) must find its own again when it resumes, not another task's.
struct ExceptionState {
  void* caught = nullptr;
  unsigned int uncaught = 0;
};

void swapExceptionState(ExceptionState& keep, const ExceptionState& install) {
  auto* globals = reinterpret_cast<ExceptionState*>(abi::__cxa_get_globals());
  keep = *globals;
  *globals = install;
}

// The production rendezvous's deepest call (a reconnect inside an outage, its messages) needs
// well under this; the guard page below turns an overflow into a crash at the spot.
constexpr size_t kStackBytes = 256 * 1024;
constexpr size_t kGuardBytes = 4096;

// A task's stack: mapped, with a guard page at its low end.
class Stack {
 public:
  Stack() {
    void* p = mmap(nullptr, kStackBytes + kGuardBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    base_ = static_cast<char*>(p);
    mprotect(base_, kGuardBytes, PROT_NONE);
  }
  ~Stack() { munmap(base_, kStackBytes + kGuardBytes); }
  Stack(const Stack&) = delete;
  Stack& operator=(const Stack&) = delete;
  char* bottom() const { return base_ + kGuardBytes; }

 private:
  char* base_;
};
}  // namespace

struct Simulation::Task {
  int owner;
  std::function<void()> body;
  Stack stack;
  ucontext_t context{};
  ExceptionState exceptions;    // its own, while another runs
  std::function<bool()> ready;  // what it waits for (nullptr: only the deadline)
  Time deadline = Time::min();  // a new task runs at once
  bool done = false;
};

Simulation::Simulation(uint64_t seed, bool keepTrace) : random_(seed), keepTrace_(keepTrace) {}
Simulation::~Simulation() { unwind(); }

void Simulation::unwind() {
  unwinding_ = true;
  while (!tasks_.empty()) {
    resume(*tasks_.front());
    std::erase_if(tasks_, [](const auto& task) { return task->done; });
  }
}

double Simulation::seconds(Time t) const {
  return std::chrono::duration<double>(t - Time{}).count();
}

int64_t Simulation::uniform(int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(random_);
}

bool Simulation::chance(double p) { return std::uniform_real_distribution<>(0, 1)(random_) < p; }

void Simulation::at(Time t, std::function<void()> action) {
  events_.emplace(std::pair{std::max(t, now_), seq_++}, std::move(action));
}

void Simulation::spawn(int owner, std::function<void()> body) {
  auto task = std::make_unique<Task>();
  task->owner = owner;
  task->body = std::move(body);
  getcontext(&task->context);
  task->context.uc_stack.ss_sp = task->stack.bottom();
  task->context.uc_stack.ss_size = kStackBytes;
  task->context.uc_link = &scheduler_;
  const auto address = reinterpret_cast<uintptr_t>(this);
  makecontext(&task->context, reinterpret_cast<void (*)()>(&Simulation::entry), 2,
              static_cast<unsigned>(address & 0xffffffffu), static_cast<unsigned>(address >> 32));
  tasks_.push_back(std::move(task));
}

void Simulation::entry(unsigned low, unsigned high) {
  auto* sim = reinterpret_cast<Simulation*>(static_cast<uintptr_t>(low) |
                                            (static_cast<uintptr_t>(high) << 32));
  Task& task = *sim->current_;
  try {
    if (sim->killed(task.owner)) throw Killed{};
    task.body();
  } catch (const Killed&) {
  } catch (...) {
    // A task's error escapes only through the simulation's own bug: run() rethrows it.
    if (!sim->failure_) sim->failure_ = std::current_exception();
  }
  task.done = true;
  // Returns through uc_link to the scheduler.
}

int Simulation::owner() const { return current_ ? current_->owner : -1; }

bool Simulation::block(const std::function<bool()>& ready, Time deadline) {
  Task& task = *current_;
  if (killed(task.owner)) throw Killed{};
  if (ready && ready()) return true;
  task.ready = ready;
  task.deadline = deadline;
  swapcontext(&task.context, &scheduler_);
  task.ready = nullptr;
  if (killed(task.owner) && std::uncaught_exceptions() == 0) throw Killed{};
  return ready && ready();
}

void Simulation::pauseOwner(int owner, Time until) { pausedUntil_[owner] = until; }

bool Simulation::paused(int owner) const {
  const auto found = pausedUntil_.find(owner);
  return found != pausedUntil_.end() && found->second > now_;
}

void Simulation::killOwner(int owner) { killed_.push_back(owner); }

bool Simulation::killed(int owner) const {
  return unwinding_ ||
         (owner >= 0 && std::find(killed_.begin(), killed_.end(), owner) != killed_.end());
}

bool Simulation::runnable(const Task& task) const {
  if (task.done) return false;
  if (killed(task.owner)) return true;
  if (paused(task.owner)) return false;
  return now_ >= task.deadline || (task.ready && task.ready());
}

Time Simulation::wakeTime(const Task& task) const {
  if (task.done || killed(task.owner)) return Time::max();
  Time wake = task.deadline;
  if (paused(task.owner)) wake = std::max(wake, pausedUntil_.at(task.owner));
  return wake;
}

void Simulation::resume(Task& task) {
  current_ = &task;
  ExceptionState scheduler;
  swapExceptionState(scheduler, task.exceptions);
  swapcontext(&scheduler_, &task.context);
  swapExceptionState(task.exceptions, scheduler);
  current_ = nullptr;
}

bool Simulation::run(Time until) {
  std::vector<Task*> ready;
  while (true) {
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
    ready.clear();
    for (auto& task : tasks_)
      if (runnable(*task)) ready.push_back(task.get());
    if (!ready.empty()) {
      resume(*ready[static_cast<size_t>(uniform(0, static_cast<int64_t>(ready.size()) - 1))]);
      std::erase_if(tasks_, [](const auto& task) { return task->done; });
      continue;
    }
    Time next = events_.empty() ? Time::max() : events_.begin()->first.first;
    for (const auto& task : tasks_) next = std::min(next, wakeTime(*task));
    if (next == Time::max()) return true;
    if (next > until) return false;
    now_ = std::max(now_, next);
    if (!events_.empty() && events_.begin()->first.first <= now_) {
      auto action = std::move(events_.begin()->second);
      events_.erase(events_.begin());
      action();
    }
  }
}

int Simulation::liveTasks() const { return static_cast<int>(tasks_.size()); }

void Simulation::note(const std::string& line) {
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%10.3f ", seconds(now_));
  for (const char* p : {static_cast<const char*>(stamp), line.c_str()})
    for (; *p; ++p) digest_ = (digest_ ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
  digest_ = (digest_ ^ '\n') * 1099511628211ull;
  if (keepTrace_) trace_.push_back(stamp + line);
}

}  // namespace dlrun::sim
