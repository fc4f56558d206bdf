#include "remote/hostfile.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <sstream>

#include "common/error.h"
#include "common/text.h"

namespace dlrun::remote {
namespace {

constexpr int kMaxSlots = 1'000'000;

// Host names, IPv4 and IPv6 addresses, and user@host as ssh takes them; nothing a shell or ssh's
// option parser would read otherwise.
bool validName(const std::string& name) {
  if (name.empty() || name.front() == '-') return false;
  return std::all_of(name.begin(), name.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '.' || c == '-' || c == '_' || c == ':' || c == '@' ||
           c == '[' || c == ']';
  });
}

int slotsOf(const std::string& text, const std::string& where) {
  const int value = parseInteger<int>(text).value_or(0);
  if (value < 1 || value > kMaxSlots)
    throw ConfigError(where + ": slots '" + text + "' is not a whole number from 1 to " +
                      std::to_string(kMaxSlots));
  return value;
}

// Appends `host`, refusing a second entry for a name already there.
void add(std::vector<Host>& hosts, std::set<std::string>& seen, Host host) {
  if (!validName(host.name))
    throw ConfigError(host.where + ": '" + host.name + "' is not a host name");
  if (!seen.insert(host.name).second)
    throw ConfigError(host.where + ": host '" + host.name +
                      "' is listed twice (give it once, with slots=N)");
  hosts.push_back(std::move(host));
}

}  // namespace

std::vector<Host> parseHostfile(const std::string& text, const std::string& file) {
  std::vector<Host> hosts;
  std::set<std::string> seen;
  std::istringstream lines(text);
  std::string line;
  for (int number = 1; std::getline(lines, line); ++number) {
    if (const size_t hash = line.find('#'); hash != std::string::npos) line.erase(hash);
    std::istringstream words(line);
    Host host{.where = file + " line " + std::to_string(number)};
    if (!(words >> host.name)) continue;  // blank or a comment
    for (std::string word; words >> word;) {
      const size_t sep = word.find_first_of("=:");
      const std::string key = word.substr(0, sep);
      if (sep == std::string::npos || (key != "slots" && key != "max_slots"))
        throw ConfigError(host.where + ": '" + word + "' is not slots=N");
      const int value = slotsOf(word.substr(sep + 1), host.where);
      if (key == "slots") host.slots = value;
    }
    add(hosts, seen, std::move(host));
  }
  if (hosts.empty()) throw ConfigError(file + ": no host in the file");
  return hosts;
}

std::vector<Host> parseHostList(const std::string& value) {
  std::vector<Host> hosts;
  std::set<std::string> seen;
  int number = 0;
  for (const std::string& item : split(value, ',')) {
    Host host{.where = "--hosts entry " + std::to_string(++number) + " '" + item + "'"};
    // The last ':' separates the slots, unless the entry is an IPv6 address in brackets.
    const size_t colon = item.rfind(':');
    if (colon != std::string::npos && item.find(']', colon) == std::string::npos &&
        (item.front() == '[' || item.find(':') == colon)) {
      host.name = item.substr(0, colon);
      host.slots = slotsOf(item.substr(colon + 1), host.where);
    } else {
      host.name = item;
    }
    add(hosts, seen, std::move(host));
  }
  return hosts;
}

}  // namespace dlrun::remote
