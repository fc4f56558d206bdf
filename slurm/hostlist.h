// Slurm hostlist expressions such as "node[01-04,7],gpu-[1-2]": checked here first, because
// libslurm accepts malformed input ("x[1-" comes back as "x]"), then expanded by the node's
// libslurm where it has one (libslurm.h), else by dlrun's own expansion of what was checked,
// which tests hold to libslurm's on the same inputs.
//
// The grammar accepted: items separated by commas; an item is host-name characters
// (letters, digits, '-', '.', '_') and bracket groups; a group is a comma-separated list of
// N or LOW-HIGH with decimal bounds, LOW <= HIGH (zero padding is kept: [08-10] gives 08 09 10).
// Text after an item's last group ("a[1-3]-ib") is a suffix that libslurm 22.05 refuses; it is
// added to each host here.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dlrun::slurm {

// The most hosts one expression may name (Slurm's own limit per range), checked before
// anything is expanded.
inline constexpr size_t kMaxHosts = 65536;

// The number of hosts the expression names. Pure. Throws ConfigError naming `what` (the
// variable it came from) and the fault.
size_t checkHostlist(std::string_view expression, std::string_view what);

// Who expands: the node's libslurm where it opens, else dlrun's own; or one of them alone (tests).
enum class Expander { Any, Libslurm, Own };

// Every host, in order, duplicates kept. Throws ConfigError for a malformed expression, or with
// Expander::Libslurm where none opens.
std::vector<std::string> expandHostlist(std::string_view expression, std::string_view what,
                                        Expander expander = Expander::Any);

}  // namespace dlrun::slurm
