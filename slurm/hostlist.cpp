#include "slurm/hostlist.h"

#include <cctype>
#include <cstdint>

#include "common/error.h"
#include "slurm/libslurm.h"

namespace dlrun::slurm {
namespace {

constexpr size_t kMaxDigits = 9;  // bounds stay far from overflow

// LOW-HIGH of a bracket group; each value is written with at least as many digits as LOW was
// (zero padding kept: [08-10] gives 08 09 10), as libslurm does.
struct Range {
  uint64_t low = 0, high = 0;
  size_t width = 1;
};

// A run of name characters, or a bracket group.
struct Part {
  std::string_view text;
  std::vector<Range> ranges;  // a group's; empty for text
};

// One comma-separated item: `head` is what libslurm expands (up to the last ']'), `suffix` is
// appended to each of its hosts; `parts` are head's, for dlrun's own expansion.
struct Item {
  std::string_view head;
  std::string_view suffix;
  size_t hosts = 1;
  std::vector<Part> parts;
};

bool isNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
}

class Parser {
 public:
  Parser(std::string_view text, std::string_view what) : text_(text), what_(what) {}

  std::vector<Item> items() {
    if (text_.empty()) fail("it is empty");
    std::vector<Item> result;
    size_t total = 0;
    while (true) {
      result.push_back(item());
      limit(total += result.back().hosts);
      if (pos_ == text_.size()) return result;
      ++pos_;  // the ',' that ended the item
    }
  }

 private:
  Item item() {
    const size_t start = pos_;
    size_t groupEnd = std::string_view::npos;  // just past the item's last ']'
    size_t textStart = pos_;                   // of the current run of name characters
    Item item;
    while (pos_ < text_.size() && text_[pos_] != ',') {
      const char c = text_[pos_];
      if (c == '[') {
        if (pos_ > textStart)
          item.parts.push_back({.text = text_.substr(textStart, pos_ - textStart)});
        item.parts.push_back({});
        limit(item.hosts *= group(item.parts.back().ranges));
        groupEnd = pos_;
        textStart = pos_;
      } else if (c == ']') {
        fail("']' at character " + std::to_string(pos_ + 1) + " has no '['");
      } else if (!isNameChar(c)) {
        fail("'" + std::string(1, c) + "' at character " + std::to_string(pos_ + 1) +
             " is not allowed in a host name");
      } else {
        ++pos_;
      }
    }
    if (pos_ == start) fail("an empty host name at character " + std::to_string(pos_ + 1));
    if (groupEnd == std::string_view::npos) {
      item.head = text_.substr(start, pos_ - start);
      item.parts.push_back({.text = item.head});
    } else {
      item.head = text_.substr(start, groupEnd - start);
      item.suffix = text_.substr(groupEnd, pos_ - groupEnd);
    }
    return item;
  }

  // "[a,b-c,...]" from the '[' into `ranges`; returns the number of values, leaves pos_ past
  // the ']'.
  size_t group(std::vector<Range>& ranges) {
    const size_t open = pos_++;
    size_t count = 0;
    while (true) {
      const size_t lowStart = pos_;
      const uint64_t low = number(open);
      const size_t width = pos_ - lowStart;
      uint64_t high = low;
      if (text_[pos_] == '-') {
        ++pos_;
        high = number(open);
        if (high < low)
          fail("the range " + std::to_string(low) + "-" + std::to_string(high) + " is reversed");
      }
      ranges.push_back({.low = low, .high = high, .width = width});
      limit(count += high - low + 1);
      if (text_[pos_] == ']') {
        ++pos_;
        return count;
      }
      if (text_[pos_] != ',')
        fail("'" + std::string(1, text_[pos_]) + "' at character " + std::to_string(pos_ + 1) +
             " follows a range where ',' or ']' is expected");
      ++pos_;
    }
  }

  // A range bound; fails unless a character follows it (the group at `open` must close).
  uint64_t number(size_t open) {
    const size_t start = pos_;
    uint64_t value = 0;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      if (pos_ - start == kMaxDigits)
        fail("a range bound at character " + std::to_string(start + 1) + " is too long");
      value = value * 10 + static_cast<uint64_t>(text_[pos_++] - '0');
    }
    if (pos_ == text_.size())
      fail("'[' at character " + std::to_string(open + 1) + " is never closed");
    if (pos_ == start)
      fail("'" + std::string(1, text_[pos_]) + "' at character " + std::to_string(pos_ + 1) +
           " is not a range bound (a number)");
    return value;
  }

  // Checked as the count grows, so nothing is expanded past the limit.
  void limit(size_t hosts) const {
    if (hosts > kMaxHosts) fail("it names more than " + std::to_string(kMaxHosts) + " hosts");
  }

  [[noreturn]] void fail(const std::string& why) const {
    throw ConfigError(std::string(what_) + "='" + std::string(text_) +
                      "' is not a Slurm hostlist: " + why);
  }

  std::string_view text_;
  std::string_view what_;
  size_t pos_ = 0;
};

std::string padded(uint64_t value, size_t width) {
  std::string digits = std::to_string(value);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

// dlrun's own expansion of an item's head: its groups in order, the first outermost.
std::vector<std::string> expandParts(const std::vector<Part>& parts) {
  std::vector<std::string> hosts{""};
  for (const Part& part : parts) {
    if (part.ranges.empty()) {
      for (auto& host : hosts) host += part.text;
      continue;
    }
    std::vector<std::string> next;
    for (const auto& host : hosts)
      for (const Range& r : part.ranges)
        for (uint64_t v = r.low; v <= r.high; ++v) next.push_back(host + padded(v, r.width));
    hosts = std::move(next);
  }
  return hosts;
}

}  // namespace

size_t checkHostlist(std::string_view expression, std::string_view what) {
  size_t total = 0;
  for (const Item& item : Parser(expression, what).items()) total += item.hosts;
  return total;
}

std::vector<std::string> expandHostlist(std::string_view expression, std::string_view what,
                                        Expander expander) {
  std::vector<std::string> hosts;
  for (const Item& item : Parser(expression, what).items()) {
    const std::string head(item.head);
    std::optional<std::vector<std::string>> expanded;
    if (expander != Expander::Own) {
      expanded = libslurmExpand(head);
      if (expander == Expander::Libslurm && !expanded)
        throw ConfigError(std::string(what) + ": no libslurm here to expand '" + head + "'");
    }
    if (!expanded) expanded = expandParts(item.parts);
    if (expanded->size() != item.hosts)
      throw ConfigError(std::string(what) + ": libslurm cannot expand '" + head + "'");
    for (auto& host : *expanded) hosts.push_back(std::move(host) + std::string(item.suffix));
  }
  return hosts;
}

}  // namespace dlrun::slurm
