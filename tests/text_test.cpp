// common/text.h: the one way dlrun cuts lists (flags, CUDA_VISIBLE_DEVICES, store records).
#include "common/text.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace dlrun
