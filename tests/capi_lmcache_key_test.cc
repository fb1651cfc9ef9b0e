// An LMCache object's name and key in the domain's prefix index through the C API
// (cxlkv_lmcache_index_key, cxlkv_lmcache_index_name): equal to what the coordinator itself
// publishes for the same object (its IndexOps), for keys at the edges of what LMCache allows;
// pinned to golden values (the format is frozen: readers on other hosts and versions derive
// the key the owner published); and a refused key names its field.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cxlkv/cxlkv.h"
#include "cxlkv/orchestrator/lmcache/coordinator.h"

namespace cxlkv::coordinator {
namespace {

constexpr std::uint64_t kAlign = 4096;

cxlkv_lmcache_key CKey(const ObjectKey& k) {
  return cxlkv_lmcache_key{k.chunk_hash_hex.c_str(), k.model_name.c_str(), k.kv_rank,
                           k.object_group_id, k.cache_salt.c_str()};
}

// Fields joined by 0x1F, written out here rather than by the code under test.
std::string Joined(const std::vector<std::string>& fields) { return absl::StrJoin(fields, "\x1f"); }

std::string CName(const cxlkv_lmcache_key& k) {
  size_t needed = 0;
  EXPECT_EQ(cxlkv_lmcache_index_name(&k, nullptr, 0, &needed), CXLKV_OK) << cxlkv_last_error();
  std::string buf(needed, '\xff');
  EXPECT_EQ(cxlkv_lmcache_index_name(&k, buf.data(), buf.size(), nullptr), CXLKV_OK)
      << cxlkv_last_error();
  EXPECT_EQ(buf.back(), '\0');
  buf.pop_back();
  return buf;
}

// Keys at the edges of what LMCache accepts: an empty hash and salt, a non-ASCII model name,
// kv_rank 0, negative and at both ends of int64, a large group id, a salt of 128 characters
// that are not ASCII (LMCache counts characters, not bytes).
std::vector<ObjectKey> EdgeKeys() {
  std::string salt128;
  for (int i = 0; i < 128; ++i) salt128 += "\xc3\xa9";  // é
  return {
      {"00ff", "llama", 3, 1, "salt"},
      {"", "m", 0, 0, ""},
      {"0123456789abcdef0123456789abcdef", "Qwen/Qwen3-8B", 0, 0, ""},
      {"ab", "\xe6\xa8\xa1\xe5\x9e\x8b-m\xc3\xb6\x64\x65l", 1, 2, "tenant-a"},  // 模型-mödel
      {"cd", "m", std::numeric_limits<std::int64_t>::max(), 0, ""},
      {"ef", "m", std::numeric_limits<std::int64_t>::min(), 0, ""},
      {"10", "m", -1, std::numeric_limits<std::int64_t>::max(), salt128},
      {"1234", "m with spaces", 7, 0, "s p"},
  };
}

// What the C API computes equals what the coordinator publishes: its index ops for finished
// objects under those keys (namespace and key), and its own IndexName.
TEST(CapiLmcacheKey, EqualsWhatTheCoordinatorPublishes) {
  const auto dir = std::filesystem::temp_directory_path() /
                   absl::StrCat("cxlkv-capi-lmcache-key-test-", ::getpid());
  std::filesystem::create_directories(dir);
  struct Cleanup {
    std::filesystem::path d;
    ~Cleanup() { std::filesystem::remove_all(d); }
  } cleanup{dir};
  const std::vector<ObjectKey> keys = EdgeKeys();
  CoordinatorConfig c;
  c.listen = "127.0.0.1:0";
  c.token_file = "/nonexistent";
  c.region_id = "r0";
  c.layout_id = "layout-\xce\xbb";  // not ASCII either
  c.region_bytes = 4 * keys.size() * kAlign;
  c.alignment_bytes = kAlign;
  c.state_file = (dir / "lmcache.state").string();
  auto co = Coordinator::Open(c, 0, 0);
  ASSERT_TRUE(co.ok()) << co.status();
  (*co)->AttachIndex({});
  const std::string epoch = (*co)->region().region_epoch;
  for (const std::string tenant : {"t", "", "\xc3\xbc-tenant"}) {
    std::vector<ReserveItem> items;
    for (const ObjectKey& k : keys) items.push_back({k, Layout{{{kAlign / 2}}, {"float16"}}});
    auto g = (*co)->Reserve(tenant, epoch, items, 0);
    ASSERT_TRUE(g.ok()) << g.status();
    std::vector<ReservationRef> refs;
    for (const auto& grant : *g) {
      ASSERT_TRUE(grant.has_value());
      refs.push_back({grant->key, grant->token});
    }
    ASSERT_TRUE((*co)->Finish(tenant, epoch, refs, 0).ok());
    const auto ops = (*co)->TakeIndexOps();
    ASSERT_EQ(ops.size(), keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      SCOPED_TRACE(absl::StrCat("tenant '", tenant, "', key ", i, ": ", IndexName(keys[i])));
      const cxlkv_lmcache_key ck = CKey(keys[i]);
      std::uint64_t ns = 0;
      cxlkv_prefix_key out{};
      ASSERT_EQ(cxlkv_lmcache_index_key(tenant.c_str(), c.layout_id.c_str(), &ck, &ns, &out),
                CXLKV_OK)
          << cxlkv_last_error();
      EXPECT_TRUE(ops[i].publish);
      EXPECT_EQ(ns, ops[i].ns);
      EXPECT_EQ(ns, (*co)->IndexNamespace(tenant));
      EXPECT_EQ(out.lo, ops[i].key.lo);
      EXPECT_EQ(out.hi, ops[i].key.hi);
      EXPECT_EQ(CName(ck), IndexName(keys[i]));
      // ns may be NULL; the key is the same.
      cxlkv_prefix_key again{};
      ASSERT_EQ(cxlkv_lmcache_index_key(tenant.c_str(), c.layout_id.c_str(), &ck, nullptr, &again),
                CXLKV_OK);
      EXPECT_EQ(again.lo, out.lo);
      EXPECT_EQ(again.hi, out.hi);
    }
  }
}

// The frozen format: the name's bytes and the key of one object, as the first release
// computed them (tests/key_test.cc pins NameKey itself; python/tests/test_keys.py these).
TEST(CapiLmcacheKey, GoldenValues) {
  const cxlkv_lmcache_key k{"00ff", "llama", 3, 1, "salt"};
  EXPECT_EQ(CName(k), Joined({"00ff", "llama", "3", "1", "salt"}));
  const cxlkv_lmcache_key no_salt{"abcd", "m", 0, 0, nullptr};
  EXPECT_EQ(CName(no_salt), Joined({"abcd", "m", "0", "0", ""}));
  std::uint64_t ns = 0;
  cxlkv_prefix_key out{};
  ASSERT_EQ(cxlkv_lmcache_index_key("t", "L1", &k, &ns, &out), CXLKV_OK) << cxlkv_last_error();
  EXPECT_EQ(ns, cxlkv_namespace("t", "lmcache", "L1"));
  cxlkv_prefix_key by_name{};
  const std::string name = CName(k);
  ASSERT_EQ(cxlkv_prefix_key_from_name(ns, name.data(), name.size(), &by_name), CXLKV_OK);
  EXPECT_EQ(out.lo, by_name.lo);
  EXPECT_EQ(out.hi, by_name.hi);
  EXPECT_EQ(ns, 0xE6932E96B439C49Aull) << std::hex << ns;
  EXPECT_EQ(out.lo, 0xDA8301E8FCF7323Bull) << std::hex << out.lo;
  EXPECT_EQ(out.hi, 0x894BFD1DF02FFFB1ull) << std::hex << out.hi;
}

// A key LMCache refuses, or a missing argument, is CXLKV_E_INVALID naming the field, and
// nothing is written.
TEST(CapiLmcacheKey, RefusedKeysNameTheirField) {
  std::string salt129(129, 's');
  struct Case {
    cxlkv_lmcache_key key;
    const char* field;
  };
  const Case cases[] = {
      {{"00FF", "m", 0, 0, ""}, "chunk_hash_hex"},
      {{"0ff", "m", 0, 0, ""}, "chunk_hash_hex"},
      {{"zz", "m", 0, 0, ""}, "chunk_hash_hex"},
      {{nullptr, "m", 0, 0, ""}, "chunk_hash_hex"},
      {{"00", "a@b", 0, 0, ""}, "model_name"},
      {{"00", nullptr, 0, 0, ""}, "model_name"},
      {{"00", "m", 0, -1, ""}, "object_group_id"},
      {{"00", "m", 0, 0, "a/b"}, "cache_salt"},
      {{"00", "m", 0, 0, "a@b"}, "cache_salt"},
      {{"00", "m", 0, 0, "a\\b"}, "cache_salt"},
      {{"00", "m", 0, 0, salt129.c_str()}, "cache_salt"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.field);
    cxlkv_prefix_key out{1, 2};
    std::uint64_t ns = 7;
    EXPECT_EQ(cxlkv_lmcache_index_key("t", "L1", &c.key, &ns, &out), CXLKV_E_INVALID);
    EXPECT_NE(std::string(cxlkv_last_error()).find(c.field), std::string::npos)
        << cxlkv_last_error();
    EXPECT_NE(std::string(cxlkv_last_error()).find("cxlkv_lmcache_index_key"), std::string::npos)
        << cxlkv_last_error();
    EXPECT_EQ(out.lo, 1u);
    EXPECT_EQ(out.hi, 2u);
    EXPECT_EQ(ns, 7u);
    char buf[64] = "untouched";
    size_t needed = 0;
    EXPECT_EQ(cxlkv_lmcache_index_name(&c.key, buf, sizeof buf, &needed), CXLKV_E_INVALID);
    EXPECT_NE(std::string(cxlkv_last_error()).find(c.field), std::string::npos)
        << cxlkv_last_error();
    EXPECT_STREQ(buf, "untouched");
  }
  const cxlkv_lmcache_key ok{"00", "m", 0, 0, ""};
  cxlkv_prefix_key out{};
  EXPECT_EQ(cxlkv_lmcache_index_key(nullptr, "L1", &ok, nullptr, &out), CXLKV_E_INVALID);
  EXPECT_NE(std::string(cxlkv_last_error()).find("tenant"), std::string::npos);
  EXPECT_EQ(cxlkv_lmcache_index_key("t", nullptr, &ok, nullptr, &out), CXLKV_E_INVALID);
  EXPECT_NE(std::string(cxlkv_last_error()).find("layout_id"), std::string::npos);
  EXPECT_EQ(cxlkv_lmcache_index_key("t", "L1", nullptr, nullptr, &out), CXLKV_E_INVALID);
  EXPECT_NE(std::string(cxlkv_last_error()).find("key"), std::string::npos);
  EXPECT_EQ(cxlkv_lmcache_index_key("t", "L1", &ok, nullptr, nullptr), CXLKV_E_INVALID);
  // A buffer too small for the name (and its NUL) is refused, with the size it needs.
  char small[16] = "x";
  size_t needed = 0;
  EXPECT_EQ(cxlkv_lmcache_index_name(&ok, small, 9, &needed), CXLKV_E_INVALID);
  EXPECT_EQ(needed, 10u);  // "00" 0x1F "m" 0x1F "0" 0x1F "0" 0x1F, NUL
  EXPECT_NE(std::string(cxlkv_last_error()).find("10 bytes"), std::string::npos)
      << cxlkv_last_error();
  EXPECT_STREQ(small, "x");
  EXPECT_EQ(cxlkv_lmcache_index_name(&ok, small, 10, nullptr), CXLKV_OK);
  EXPECT_EQ(std::string(small), Joined({"00", "m", "0", "0", ""}));
  EXPECT_EQ(cxlkv_lmcache_index_name(&ok, nullptr, 4, &needed), CXLKV_E_INVALID);
}

}  // namespace
}  // namespace cxlkv::coordinator
