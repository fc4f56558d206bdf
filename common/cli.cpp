#include "common/cli.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>

#include "common/error.h"
#include "common/log.h"

namespace dlrun {

namespace {
class UsageFormatter : public CLI::Formatter {
 public:
  explicit UsageFormatter(std::vector<std::string> forms) : forms_(std::move(forms)) {}
  std::string make_usage(const CLI::App*, std::string) const override {
    std::string usage;
    for (const auto& form : forms_) usage += (usage.empty() ? "Usage: " : "  or:  ") + form + "\n";
    return usage;
  }

 private:
  std::vector<std::string> forms_;
};
}  // namespace

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

void setUsage(CLI::App& app, const std::vector<std::string>& forms) {
  app.formatter(std::make_shared<UsageFormatter>(forms));
}

CLI::Validator oneOf(std::vector<std::string> names, const std::string& why) {
  std::string listed;
  for (size_t i = 0; i < names.size(); ++i)
    listed += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  listed += why;
  // CLI11 puts "--flag: " before the message; the empty description keeps --help as it was.
  return CLI::Validator(
      [names = std::move(names), listed = std::move(listed)](std::string& value) {
        return std::ranges::find(names, value) != names.end() ? std::string()
                                                              : "'" + value + "' is not " + listed;
      },
      "");
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
