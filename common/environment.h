// A process's environment variables, by name: what discovery reads, what the agent gives its
// workers, what a remote agent's command line carries.
#pragma once

#include <map>
#include <string>

namespace dlrun {

using Environment = std::map<std::string, std::string>;

}  // namespace dlrun
