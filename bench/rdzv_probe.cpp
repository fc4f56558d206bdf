// dlrun-rdzv-probe: the worker of bench/rdzv_bench.py. Plain C calls and, where the toolchain
// can, linked statically (as dlrun-rank-probe): its start-up is part of every window the
// benchmark measures, the same under every launcher, so it is kept small (0.4 ms of CPU against
// 0.9 ms dynamically linked with iostreams; 32 of them start at once at the end of a window).
//
// Usage: dlrun-rdzv-probe OUT_DIR [STOP_FILE]
// First thing, it reads the clock; then writes OUT_DIR/<rank>-<restart>-<pid>.json (through a
// temporary name and a rename, so a file that exists is complete) with that time, RANK,
// WORLD_SIZE, GROUP_RANK, TORCHELASTIC_RESTART_COUNT, MASTER_ADDR, MASTER_PORT, its PID, an id
// unique to this process and BENCH_AGENT. Without STOP_FILE it exits 0; with it, it waits until
// STOP_FILE exists (looking every 20 ms, for at most 10 minutes), then exits 0.
// With BENCH_SIGNAL_PID set it sends that process SIGUSR1 right after reading the clock, before
// the record exists: rdzv_bench.py's --control has dlrund --stats take a snapshot of its counts
// at each worker's start.
#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

// An integer variable as JSON: null when the launcher did not set it.
std::string number(const char* name) {
  const char* value = std::getenv(name);
  if (!value || !*value) return "null";
  for (const char* c = value; *c; ++c) {
    if (*c < '0' || *c > '9') return "null";
  }
  return value;
}

// A variable as a JSON string (null when unset); the launchers set addresses, port numbers
// and small names, so only a quote or a backslash needs escaping.
std::string text(const char* name) {
  const char* value = std::getenv(name);
  if (!value) return "null";
  std::string quoted = "\"";
  for (const char* c = value; *c; ++c) {
    if (*c == '"' || *c == '\\') quoted += '\\';
    quoted += *c;
  }
  return quoted + "\"";
}

bool writeFile(const std::string& path, const std::string& content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  const bool written =
      ::write(fd, content.data(), content.size()) == static_cast<ssize_t>(content.size());
  return ::close(fd) == 0 && written;
}

}  // namespace

int main(int argc, char** argv) {
  timespec start{};
  ::clock_gettime(CLOCK_REALTIME, &start);
  if (const char* notify = std::getenv("BENCH_SIGNAL_PID"); notify && *notify)
    ::kill(static_cast<pid_t>(std::atoi(notify)), SIGUSR1);
  if (argc < 2 || argc > 3) {
    std::fputs("usage: dlrun-rdzv-probe OUT_DIR [STOP_FILE]\n", stderr);
    return 2;
  }
  const std::string pid = std::to_string(::getpid());
  char time[64];
  std::snprintf(time, sizeof(time), "%lld.%06ld", static_cast<long long>(start.tv_sec),
                start.tv_nsec / 1000);
  const std::string nanos =
      std::to_string(static_cast<long long>(start.tv_sec) * 1'000'000'000LL + start.tv_nsec);
  const std::string record =
      std::string("{\"time\": ") + time + ", \"rank\": " + number("RANK") +
      ", \"world_size\": " + number("WORLD_SIZE") + ", \"group_rank\": " + number("GROUP_RANK") +
      ", \"restart_count\": " + number("TORCHELASTIC_RESTART_COUNT") +
      ", \"master_addr\": " + text("MASTER_ADDR") + ", \"master_port\": " + number("MASTER_PORT") +
      ", \"pid\": " + pid + ", \"uid\": \"" + pid + "-" + nanos +
      "\", \"agent\": " + text("BENCH_AGENT") + "}";
  const std::string name = std::string(argv[1]) + "/" + number("RANK") + "-" +
                           number("TORCHELASTIC_RESTART_COUNT") + "-" + pid + ".json";
  if (!writeFile(name + ".tmp", record) || ::rename((name + ".tmp").c_str(), name.c_str()) != 0) {
    std::perror("dlrun-rdzv-probe");
    return 1;
  }
  if (argc == 3) {
    const timespec pause{0, 20'000'000};
    for (int i = 0; i < 30'000 && ::access(argv[2], F_OK) != 0; ++i) ::nanosleep(&pause, nullptr);
  }
  return 0;
}
