// What every dlrun program's command line shares: parsing with CLI11 under one error policy.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
class Validator;
}  // namespace CLI

namespace dlrun {

// Parses args (without argv[0]). --help and --version print to stdout and return the exit code
// to end with (0); a bad flag throws ConfigError with CLI11's one-line message; otherwise
// returns nullopt and the app's bound variables hold the values.
std::optional<int> parseCommandLine(CLI::App& app, const std::vector<std::string>& args,
                                    const std::string& version);

// Replaces CLI11's "Usage: NAME [OPTIONS]" line of --help with `forms`: the first after
// "Usage: ", each other one on a line of its own after "  or:  " (as help2man reads a synopsis).
void setUsage(CLI::App& app, const std::vector<std::string>& forms);

// The check of a flag that takes one of `names`, as CLI11 runs it while parsing (on the flag
// and on its environment variable alike): another value fails parsing with the one-line
// "--flag: 'VALUE' is not a, b or c" followed by `why`. Adds nothing to --help, whose text
// names the choices in words.
CLI::Validator oneOf(std::vector<std::string> names, const std::string& why = "");

// Runs a main's body under the one error policy of every dlrun program: a ConfigError prints
// "NAME: error: ..." and gives 2, any other exception the same line and 1.
int guardedMain(const std::function<int()>& body);

}  // namespace dlrun
