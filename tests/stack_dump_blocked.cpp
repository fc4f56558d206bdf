// stack_dump_test's native target: writes the file named by its argument, then waits forever
// on its main thread in a function of a name no library has, while a second thread sleeps.
#include <unistd.h>

#include <cstdio>
#include <thread>

__attribute__((noinline)) void dlrunStackTestBlockedHere(const char* ready) {
  if (std::FILE* f = std::fopen(ready, "w")) std::fclose(f);
  while (true) ::pause();
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  std::thread([] {
    while (true) ::sleep(1000);
  }).detach();
  dlrunStackTestBlockedHere(argv[1]);
}
