// libslurm, opened at run time (issue 46): the cluster's own, never linked or bundled, so one dlrun
// (a wheel, a package) runs on nodes with another Slurm or none. The first library that opens of
// DLRUN_LIBSLURM (a path or a name, for a library elsewhere), libslurm.so, then libslurm.so.NN
// from newest to oldest; each must have the four hostlist functions dlrun calls. Where none does,
// hostlists are expanded by dlrun's own parser (hostlist.h), tested against libslurm's.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace dlrun::slurm {

// The hosts libslurm expands `expression` to, in order; nullopt when no libslurm opened here, or
// when it refuses the expression. Opened once per process (thread-safe).
std::optional<std::vector<std::string>> libslurmExpand(const std::string& expression);

// The library opened ("libslurm.so.38"), or empty when none.
std::string libslurmName();

}  // namespace dlrun::slurm
