// common/text.h: the one way dlrun cuts lists (flags, CUDA_VISIBLE_DEVICES, store records) and
// reads whole-string integers.
#include "common/text.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace dlrun {
namespace {

using Parts = std::vector<std::string>;

TEST(Split, EveryPieceBetweenSeparatorsEmptyOnesIncluded) {
  EXPECT_EQ(split("a,b,c", ','), (Parts{"a", "b", "c"}));
  EXPECT_EQ(split("a,,b,", ','), (Parts{"a", "", "b", ""}));
  EXPECT_EQ(split("", ','), (Parts{""}));
  EXPECT_EQ(split("no separator", ','), (Parts{"no separator"}));
  EXPECT_EQ(split("x\ny\n", '\n'), (Parts{"x", "y", ""}));
}

TEST(ParseInteger, TheWholeStringAsOneDecimalInteger) {
  EXPECT_EQ(parseInteger<int>("42"), 42);
  EXPECT_EQ(parseInteger<int>("-7"), -7);
  EXPECT_EQ(parseInteger<int>("0"), 0);
  EXPECT_EQ(parseInteger<int64_t>("9223372036854775807"), INT64_MAX);
  EXPECT_EQ(parseInteger<int64_t>("-9223372036854775808"), INT64_MIN);
  EXPECT_EQ(parseInteger<uint16_t>("65535"), 65535);
}

TEST(ParseInteger, NothingButDigitsAndOneMinus) {
  for (const char* text : {"", "+1", " 1", "1 ", "12abc", "0x10", "1.5", "-", "--1"})
    EXPECT_EQ(parseInteger<int>(text), std::nullopt) << "'" << text << "'";
}

TEST(ParseInteger, NoWrapAroundForUnsignedAndNothingOutOfRange) {
  EXPECT_EQ(parseInteger<unsigned>("-1"), std::nullopt);
  EXPECT_EQ(parseInteger<uint16_t>("65536"), std::nullopt);
  EXPECT_EQ(parseInteger<uint16_t>("-0"), std::nullopt);
  EXPECT_EQ(parseInteger<int>("2147483648"), std::nullopt);
  EXPECT_EQ(parseInteger<int64_t>("9223372036854775808"), std::nullopt);
}

TEST(ParseInteger, ReadsOnlyTheViewNotWhatFollowsIt) {
  const std::string_view text = "123456";
  EXPECT_EQ(parseInteger<int>(text.substr(0, 3)), 123);
}

// Each expectation is what Python's string.Template(text).safe_substitute(values) gives.
TEST(SubstituteTemplate, BothFormsOfANameAndTheDollarEscape) {
  const std::map<std::string, std::string, std::less<>> values{{"rank", "3"}, {"role", "ps"}};
  EXPECT_EQ(substituteTemplate("[${role}${rank}]:", values), "[ps3]:");
  EXPECT_EQ(substituteTemplate("$rank.$role-$rank", values), "3.ps-3");
  EXPECT_EQ(substituteTemplate("$$rank costs $$5", values), "$rank costs $5");
  EXPECT_EQ(substituteTemplate("${RANK}", {{"RANK", "7"}}), "7");
}

TEST(SubstituteTemplate, WhatIsNoKnownNameStaysAsWritten) {
  const std::map<std::string, std::string, std::less<>> values{{"rank", "3"}};
  EXPECT_EQ(substituteTemplate("$ranks ${hostname} $HOME ${rank", values),
            "$ranks ${hostname} $HOME ${rank");
  EXPECT_EQ(substituteTemplate("a$ b$ ${} $1 ${ rank}", values), "a$ b$ ${} $1 ${ rank}");
  EXPECT_EQ(substituteTemplate("", values), "");
  EXPECT_EQ(substituteTemplate("$", values), "$");
}

TEST(SubstituteTemplate, ValuesAreNotExpandedAgain) {
  EXPECT_EQ(substituteTemplate("$a$b", {{"a", "$b"}, {"b", "x"}}), "$bx");
}

}  // namespace
}  // namespace dlrun
