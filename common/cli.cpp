#include "common/cli.h"

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>

#include "common/error.h"
#include "common/log.h"

namespace dlrun {

namespace {
// The one --help text on every CLI11 release: 2.4 (Debian 13) prints an option's default as
// "TYPE [DEFAULT] ", 2.1 (Debian 12) as "TYPE=DEFAULT", which this keeps (the reference pages are
// written from --help); `forms`, when given, replace the usage line.
class HelpFormatter : public CLI::Formatter {
 public:
  explicit HelpFormatter(std::vector<std::string> forms = {}) : forms_(std::move(forms)) {}

  std::string make_usage(const CLI::App* app, std::string name) const override {
    if (forms_.empty()) return CLI::Formatter::make_usage(app, std::move(name));
    std::string usage;
    for (const auto& form : forms_) usage += (usage.empty() ? "Usage: " : "  or:  ") + form + "\n";
    return usage;
  }

  std::string make_option_opts(const CLI::Option* opt) const override {
    if (!opt->get_option_text().empty()) return " " + opt->get_option_text();
    std::string out;
    if (opt->get_type_size() != 0) {
      if (!opt->get_type_name().empty()) out += " " + get_label(opt->get_type_name());
      if (!opt->get_default_str().empty()) out += "=" + defaultText(opt->get_default_str());
      if (opt->get_expected_max() == CLI::detail::expected_max_vector_size)
        out += " ...";
      else if (opt->get_expected_min() > 1)
        out += " x " + std::to_string(opt->get_expected());
      if (opt->get_required()) out += " " + get_label("REQUIRED");
    }
    if (!opt->get_envname().empty())
      out += " (" + get_label("Env") + ":" + opt->get_envname() + ")";
    if (!opt->get_needs().empty()) {
      out += " " + get_label("Needs") + ":";
      for (const CLI::Option* other : opt->get_needs()) out += " " + other->get_name();
    }
    if (!opt->get_excludes().empty()) {
      out += " " + get_label("Excludes") + ":";
      for (const CLI::Option* other : opt->get_excludes()) out += " " + other->get_name();
    }
    return out;
  }

 private:
  // An empty list's default: "[]" in 2.1, "{}" in 2.4.
  static std::string defaultText(const std::string& text) { return text == "{}" ? "[]" : text; }

  std::vector<std::string> forms_;
};
}  // namespace

std::optional<int> parseCommandLine(CLI::App& app, const std::vector<std::string>& args,
                                    const std::string& version) {
  // CLI11 consumes its argument vector from the back.
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  if (!std::dynamic_pointer_cast<HelpFormatter>(app.get_formatter()))
    app.formatter(std::make_shared<HelpFormatter>());
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
  app.formatter(std::make_shared<HelpFormatter>(forms));
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
