// The worker of large launches (bench/launch_bench.sh, tests/python/test_dlrun_scale.py): appends
// one line, "RANK START_NS TF_CONFIG_BYTES", to the file its first argument names, in one
// O_APPEND write (lines of concurrent workers never mix), and exits 0. START_NS is
// CLOCK_MONOTONIC when it started, so a benchmark reads when the last worker started;
// TF_CONFIG_BYTES is -1 when TF_CONFIG is unset. Plain C calls and, where the toolchain can,
// linked statically: it starts in a fraction of a dynamically linked program's time, so a
// launch of thousands measures the launcher.
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  if (argc < 2) {
    std::fputs("usage: dlrun-rank-probe FILE\n", stderr);
    return 2;
  }
  const char* rank = std::getenv("RANK");
  if (rank == nullptr) {
    std::fputs("dlrun-rank-probe: RANK is unset\n", stderr);
    return 3;
  }
  const char* tfConfig = std::getenv("TF_CONFIG");
  char line[128];
  const int length =
      std::snprintf(line, sizeof(line), "%s %lld %ld\n", rank,
                    static_cast<long long>(now.tv_sec) * 1'000'000'000LL + now.tv_nsec,
                    tfConfig != nullptr ? static_cast<long>(std::strlen(tfConfig)) : -1L);
  const int fd = ::open(argv[1], O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0 || ::write(fd, line, length) != length) {
    std::perror("dlrun-rank-probe");
    return 4;
  }
  ::close(fd);
  return 0;
}
