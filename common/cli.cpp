#include "common/cli.h"

#include <CLI/CLI.hpp>
#include <iostream>

#include "common/error.h"
#include "common/log.h"

namespace dlrun {

std::optional<int> parseCommandLine(CLI::App& app, const std::vector<std::string>& args,
                                    const std::string& version) {
  // CLI11 consumes its argument vector from the back.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::CallForVersion&) {
    std::cout << app.get_name() << " " << version << "\n";
    return 0;
  } catch (const CLI::ParseError& e) {
    throw ConfigError(e.what());
  }
  return std::nullopt;
}

int guardedMain(const std::function<int()>& body) {
  try {
    return body();
  } catch (const ConfigError& e) {
    log::info(std::string("error: ") + e.what());
    return 2;
  } catch (const std::exception& e) {
    log::info(std::string("error: ") + e.what());
    return 1;
  }
}

}  // namespace dlrun
