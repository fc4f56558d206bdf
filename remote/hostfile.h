// The hosts of a one-command launch (dlrun --hostfile FILE, dlrun --hosts a:4,b:4): MPI's and
// DeepSpeed's hostfile format, `host slots=N` a line, and the compact list of --hosts. Pure: the
// launcher reads the file and resolves the names; every rule on the text is checked here, and a
// failure is a ConfigError naming the file's line or the list's entry.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace dlrun::remote {

struct Host {
  std::string name;          // as written: what ssh is given and what prefixes the node's output
  std::optional<int> slots;  // workers on it, when the entry says
  std::string where;         // "FILE line 3" or "--hosts entry 2", for messages
};

// `host`, `host slots=N` (also `slots:N` and `max_slots=M`, which is accepted and ignored, as
// Open MPI's files write), comments from '#', blank lines. Refused: no host, a host twice,
// slots that are not a whole number from 1 to 1,000,000, an unknown word, a name that starts with
// '-' or holds characters no host name has. `file` names the file in messages.
std::vector<Host> parseHostfile(const std::string& text, const std::string& file);

// "a:4,b:4" or "a,b" (slots unsaid): the same rules, for --hosts.
std::vector<Host> parseHostList(const std::string& value);

}  // namespace dlrun::remote
