// slurm_hostlist_test's child: expands argv[1] as dlrun does (the node's libslurm, else dlrun's
// own) in a fresh process, and prints the library it opened (or "none") then each host, one a
// line.
#include <iostream>

#include "slurm/hostlist.h"
#include "slurm/libslurm.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const auto hosts = dlrun::slurm::expandHostlist(argv[1], "SLURM_JOB_NODELIST");
  const std::string library = dlrun::slurm::libslurmName();
  std::cout << (library.empty() ? "none" : library) << "\n";
  for (const auto& host : hosts) std::cout << host << "\n";
  return 0;
}
