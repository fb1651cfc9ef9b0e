// coherence/key.h: the one text form of a key (FormatKey / ParseKey) and keys from an engine's
// own digest (DigestKey), pinned to the golden values the C API and Python pin too
// (tests/capi_tier_test.c TestDigestKeys, python/tests/test_keys.py).
#include "cxlkv/coherence/key.h"

#include <cstddef>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "test_util.h"

namespace cxlkv::coherence {
namespace {

TEST(KeyText, HighWordFirstThirtyTwoDigits) {
  const PrefixKey k{0x0011223344556677ull, 0x0123456789abcdefull};
  EXPECT_EQ(FormatKey(k), "0123456789abcdef0011223344556677");
  EXPECT_EQ(FormatKey({}), std::string(32, '0'));
  EXPECT_EQ(*ParseKey("0123456789abcdef0011223344556677"), k);
  EXPECT_EQ(*ParseKey("0x0123456789ABCDEF0011223344556677"), k);
}

TEST(KeyText, RoundTripsRandomKeys) {
  const std::uint64_t seed = cxlkv::testing::TestSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int i = 0; i < 10000; ++i) {
    const PrefixKey k{rng(), rng()};
    auto back = ParseKey(FormatKey(k));
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(*back, k) << FormatKey(k);
  }
}

TEST(KeyText, BadTextNamesItAndTheForm) {
  for (const char* bad :
       {"", "0123", "0123456789abcdef001122334455667", "0123456789abcdef00112233445566778",
        "0123456789abcdeg0011223344556677", "0123456789abcdef:0011223344556677"}) {
    auto k = ParseKey(bad);
    ASSERT_FALSE(k.ok()) << bad;
    EXPECT_EQ(k.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(k.status().message().find(std::string("'") + bad + "'"), std::string::npos)
        << k.status();
    EXPECT_NE(k.status().message().find("32 hex digits"), std::string::npos) << k.status();
  }
}

// The frozen digest-key format: namespace 42, digest bytes i * 7 + 1.
TEST(DigestKey, GoldenValues) {
  const PrefixKey parent{0x1111222233334444ull, 0x5555666677778888ull};
  struct Golden {
    std::size_t len;
    bool with_parent;
    PrefixKey key;
  };
  const Golden golden[] = {
      {16, false, {0xFA0BF79F338DB8E0ull, 0x78D27ECB1C93BEBAull}},
      {16, true, {0x5AA18338691C3F46ull, 0xE5C560D7897E925Dull}},
      {32, false, {0x1A5458CD078495D9ull, 0x5CB8D4E3C2A17851ull}},
      {32, true, {0xF4B3E504F02C8F83ull, 0x870E3E60D66C466Aull}},
  };
  for (const Golden& g : golden) {
    std::vector<std::byte> d(g.len);
    for (std::size_t i = 0; i < g.len; ++i) d[i] = static_cast<std::byte>((i * 7 + 1) & 0xff);
    auto k = DigestKey(42, g.with_parent ? parent : PrefixKey{}, d);
    ASSERT_TRUE(k.ok()) << k.status();
    EXPECT_EQ(*k, g.key) << "length " << g.len << (g.with_parent ? " with parent" : "");
  }
}

// The frozen name-key format (NameKey: LMCache's objects in the domain's index), pinned here
// and in python/tests/test_keys.py; the name is an LMCache key's fields joined by 0x1F.
TEST(NameKey, GoldenValues) {
  EXPECT_EQ(NameKey(42, ""), (PrefixKey{0xF2F85EE3469D559Full, 0x2F464639C2BB76CAull}));
  EXPECT_EQ(NameKey(42, absl::string_view("00ff\x1fllama\x1f"
                                          "3\x1f"
                                          "1\x1fsalt")),
            (PrefixKey{0x519EBCEFED477DAAull, 0x1209500162F25A1Cull}));
  EXPECT_NE(NameKey(43, ""), NameKey(42, "")) << "the namespace is hashed";
  EXPECT_NE(NameKey(42, "a"), NameKey(42, "b"));
}

TEST(DigestKey, OnlyRawSixteenOrThirtyTwoBytes) {
  for (std::size_t len : {0, 8, 15, 17, 31, 33, 64}) {
    std::vector<std::byte> d(len, std::byte{1});
    auto k = DigestKey(1, {}, d);
    ASSERT_FALSE(k.ok()) << len;
    EXPECT_NE(k.status().message().find(std::to_string(len) + " bytes"), std::string::npos)
        << k.status();
    EXPECT_NE(k.status().message().find("not its hex text"), std::string::npos);
  }
}

}  // namespace
}  // namespace cxlkv::coherence
