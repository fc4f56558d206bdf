// SHA-256 (common/sha256.h): FIPS 180-4's examples, and OpenSSL's digest for every length
// around the padding's block boundaries.
#include "common/sha256.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <algorithm>
#include <string>

namespace dlrun {
namespace {

TEST(Sha256, StandardExamples) {
  EXPECT_EQ(sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256Hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklm"
                      "nopqklmnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
  EXPECT_EQ(sha256Hex(std::string(1'000'000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, EveryLengthAcrossTwoBlocksMatchesOpenSsl) {
  std::string data;
  for (int length = 0; length <= 300; ++length) {
    unsigned char expected[EVP_MAX_MD_SIZE];
    unsigned int size = 0;
    ASSERT_EQ(EVP_Digest(data.data(), data.size(), expected, &size, EVP_sha256(), nullptr), 1);
    const auto digest = sha256(data);
    ASSERT_EQ(size, digest.size());
    EXPECT_TRUE(std::equal(digest.begin(), digest.end(), expected)) << "length " << length;
    data += static_cast<char>(length * 37 + 11);  // every byte value, high bits included
  }
}

}  // namespace
}  // namespace dlrun
