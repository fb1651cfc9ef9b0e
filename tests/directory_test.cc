// The cross-domain prefix directory (docs/ha.md).
//
// Filter / Summary / Anchors: the Bloom filter and the summary record, no etcd (label unit).
// DirectoryTest: real etcd (3 members on loopback, tests/etcd_cluster.h) and two real
// cxlkv-orchestrator processes leading two domains; blocks are published and retired through
// each domain's real owner by a host in this process. Checks: a prefix published in domain A is
// reported for A and not for B (with keys chosen outside B's filter, so its false-positive rate
// cannot fail the test), by the C++ reader, cxlkvctl where (etcd directly and through the other
// domain's orchestrator), the C API and the Python package; the filter follows a retire; no
// per-block keys in etcd; a domain killed with -9 drops out after its lease TTL. Skipped without
// Debian's etcd-server. Random keys take CXLKV_SEED (printed on failure).
#include "cxlkv/orchestrator/directory.h"

#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/cxlkv.h"
#include "cxlkv/orchestrator/config.h"
#include "cxlkv/orchestrator/directory_reader.h"
#include "cxlkv/orchestrator/published_key.h"
#include "cxlkv/tier/reuse_tracker.h"
#include "directory_fixture.h"
#include "etcd_cluster.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "orchestrator_process.h"

namespace cxlkv::testing {
namespace {

namespace co = ::cxlkv::coherence;
namespace dir = ::cxlkv::orchestrator::directory;
using std::chrono::milliseconds;

std::uint64_t Seed() {
  const char* s = std::getenv("CXLKV_SEED");
  return s != nullptr ? std::strtoull(s, nullptr, 0) : 0x5eedd1c7ull;
}

std::vector<co::PrefixKey> RandomKeys(std::mt19937_64& rng, std::size_t n) {
  std::vector<co::PrefixKey> v(n);
  for (auto& k : v) k = co::PrefixKey{rng(), rng()};
  return v;
}

TEST(Filter, NoFalseNegativesAndTheRateItStates) {
  const std::uint64_t seed = Seed();
  SCOPED_TRACE(absl::StrCat("CXLKV_SEED=", seed));
  std::mt19937_64 rng(seed);
  const dir::FilterSize size = dir::SizeFor(10000, 0.01);
  dir::BloomFilter f(size);
  const auto in = RandomKeys(rng, 10000);
  for (const auto& k : in) f.Add(k);
  for (const auto& k : in) ASSERT_TRUE(f.MayContain(k));
  const auto out = RandomKeys(rng, 200000);
  std::size_t fp = 0;
  for (const auto& k : out) fp += f.MayContain(k) ? 1 : 0;
  const double measured = static_cast<double>(fp) / static_cast<double>(out.size());
  const double stated = dir::FalsePositiveRate(size, in.size());
  EXPECT_NEAR(stated, 0.01, 0.002);
  EXPECT_GT(measured, stated * 0.6) << measured;
  EXPECT_LT(measured, stated * 1.5) << measured;
}

TEST(Filter, SizesAsDocumented) {
  // docs/ha.md: 9.6 bits and 7 hashes per key at 1%; 1 MiB holds about 875k keys at 1%.
  const dir::FilterSize s = dir::SizeFor(1000, 0.01);
  EXPECT_EQ(s.hashes, 7u);
  EXPECT_NEAR(static_cast<double>(s.bits) / 1000, 9.6, 0.1);
  const dir::FilterSize big = dir::SizeFor(875000, 0.01);
  EXPECT_LE(big.bits / 8, dir::kMaxFilterBytes);
  EXPECT_LT(dir::FalsePositiveRate(big, 875000), 0.011);
  // Capped at 1 MiB: more keys raise the rate instead of the size.
  EXPECT_EQ(dir::SizeFor(10'000'000, 0.01).bits / 8, dir::kMaxFilterBytes);
  const dir::FilterSize fixed = dir::SizeForBytes(4096, 1024);
  EXPECT_EQ(fixed.bits, 4096u * 8);
  EXPECT_EQ(fixed.hashes, 22u);  // 32 bits a key: round(32 ln 2)
}

TEST(Summary, RoundTripsAndRefusesTornRecords) {
  std::mt19937_64 rng(Seed());
  dir::Summary s;
  s.domain = "rack-7";
  s.epoch = 42;
  s.published = 3;
  s.anchors = 3;
  s.built_unix_ms = 1234567;
  s.anchor_every = 1;
  s.filter = dir::BloomFilter(dir::SizeFor(100, 0.01));
  const auto keys = RandomKeys(rng, 3);
  for (const auto& k : keys) s.filter.Add(k);
  const std::string rec = dir::EncodeSummary(s);
  auto back = dir::DecodeSummary(rec);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->domain, "rack-7");
  EXPECT_EQ(back->epoch, 42);
  EXPECT_EQ(back->published, 3u);
  EXPECT_EQ(back->built_unix_ms, 1234567);
  EXPECT_EQ(back->filter.words(), s.filter.words());
  for (const auto& k : keys) EXPECT_TRUE(back->filter.MayContain(k));
  for (std::size_t i = 0; i < rec.size(); i += 7) {
    std::string torn = rec;
    torn[i] = static_cast<char>(torn[i] ^ 0x10);
    EXPECT_EQ(dir::DecodeSummary(torn).status().code(), absl::StatusCode::kDataLoss) << i;
  }
  EXPECT_FALSE(dir::DecodeSummary(rec.substr(0, rec.size() - 9)).ok());
  EXPECT_FALSE(dir::DecodeSummary("").ok());
}

TEST(Anchors, OneKeyInN) {
  std::mt19937_64 rng(Seed());
  const auto keys = RandomKeys(rng, 80000);
  std::size_t n = 0;
  for (const auto& k : keys) n += dir::IsAnchor(k, 8) ? 1 : 0;
  EXPECT_NEAR(static_cast<double>(n) / 80000.0, 1.0 / 8, 0.01);
  EXPECT_TRUE(dir::IsAnchor(keys[0], 1));
}

TEST(Config, DirectoryAndEventsSections) {
  const std::string base =
      "[domain]\nname = \"d\"\npool = \"file:/tmp/p?size=1G\"\n"
      "prefix_domain = \"file:/tmp/d?size=4M\"\nstate_file = \"/tmp/s\"\n"
      "[rpc]\nsocket = \"/tmp/o.sock\"\n";
  auto c = orchestrator::ParseConfig(base, "t.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->directory.enabled);
  EXPECT_EQ(c->directory.anchor_every, 1u);
  EXPECT_DOUBLE_EQ(c->directory.fp_rate, 0.01);
  EXPECT_FALSE(c->events.enabled());  // off by default
  EXPECT_EQ(c->events.format, "array");
  c = orchestrator::ParseConfig(
      base +
          "[directory]\nfp_rate = 0.001\nanchor_every = 4\nbytes = 65536\n"
          "min_interval_ms = 200\nrefresh_ms = 1000\nexpected_keys = 100000\n"
          "[events]\nendpoint = \"tcp://*:5557\"\nformat = \"map\"\n"
          "block_hash = \"uint64\"\nblock_size = 32\ndata_parallel_rank = 1\n"
          "topic = \"x\"\ninterval_ms = 10\nhwm = 10\n",
      "t.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->directory.fp_rate, 0.001);
  EXPECT_EQ(c->directory.anchor_every, 4u);
  EXPECT_EQ(c->directory.bytes, 65536u);
  EXPECT_EQ(c->directory.expected_keys, 100000u);
  EXPECT_TRUE(c->events.enabled());
  EXPECT_EQ(c->events.format, "map");
  EXPECT_EQ(c->events.block_hash, "uint64");
  EXPECT_EQ(c->events.block_size, 32u);
  EXPECT_EQ(c->events.medium, "SHARED");  // what Dynamo reads as its External tier
  auto bad = orchestrator::ParseConfig(base + "[events]\nmedium = \"\"\n", "t.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("an empty medium"), std::string::npos) << bad.status();
  bad = orchestrator::ParseConfig(base + "[events]\nformat = \"json\"\n", "t.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'json' is not one of: array, map"), std::string::npos)
      << bad.status();
  bad = orchestrator::ParseConfig(base + "[directory]\nfp_rate = 0.9\n", "t.toml");
  EXPECT_NE(bad.status().message().find("directory.fp_rate"), std::string::npos) << bad.status();
  bad = orchestrator::ParseConfig(base + "[directory]\nbytes = 2000000\n", "t.toml");
  EXPECT_FALSE(bad.ok());
  bad = orchestrator::ParseConfig(base + "[events]\nendpont = \"x\"\n", "t.toml");
  EXPECT_NE(bad.status().message().find("unknown key"), std::string::npos) << bad.status();
}

// A publish secret in a file the way the orchestrator reads it (mode 600); the caller removes it.
std::string SecretFile(const std::string& secret) {
  char path[] = "/tmp/cxlkv-secret-XXXXXX";
  const int fd = ::mkstemp(path);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(::write(fd, secret.data(), secret.size()), static_cast<ssize_t>(secret.size()));
  ::close(fd);
  return path;
}

const std::string kSecret = "cxlkv-test-secret-0123456789abcdef";
// A domain whose chain keys leave unkeyed (keys.unkeyed, the opt-out of the keyed default).
const std::string kUnkeyed = "[keys]\nunkeyed = true\n";

// The vector computed outside cxlkv: `openssl dgst -sha256 -hmac SECRET` over the label, its
// NUL and the key's words big-endian (hi 0123456789abcdef, lo fedcba9876543210) gives
// b0daf149e64c21dd 10a8a6c9b8fc8077 ...; over "cxlkv key id v1\0" efd585ae30061bb6 ...
// python/tests/test_keys.py checks Python's hmac against the same digits.
TEST(PublishedKey, KnownAnswerAndId) {
  auto k = orchestrator::PublishedKeyer::Create(kSecret);
  ASSERT_TRUE(k.ok()) << k.status();
  const co::PrefixKey out = k->Apply(co::PrefixKey{0xfedcba9876543210ull, 0x0123456789abcdefull});
  EXPECT_EQ(out.hi, 0xb0daf149e64c21ddull);
  EXPECT_EQ(out.lo, 0x10a8a6c9b8fc8077ull);
  EXPECT_EQ(k->id(), 0xefd585ae30061bb6ull);
  auto other = orchestrator::PublishedKeyer::Create(kSecret + "x");
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->id(), k->id());
  EXPECT_NE(other->Apply(co::PrefixKey{1, 2}), k->Apply(co::PrefixKey{1, 2}));
  auto shortk = orchestrator::PublishedKeyer::Create("too-short");
  ASSERT_FALSE(shortk.ok());
  EXPECT_NE(shortk.status().message().find("at least 16 bytes"), std::string::npos)
      << shortk.status();
}

// A keyed summary (what a leader with keys.publish_file writes): whoever lacks the secret can
// neither match a known prompt's chain key against the filter nor get a verdict from a reader;
// the holder of the secret matches every key.
TEST(Summary, KeyedMatchesOnlyWithItsSecret) {
  const std::uint64_t seed = Seed();
  SCOPED_TRACE(absl::StrCat("CXLKV_SEED=", seed));
  std::mt19937_64 rng(seed);
  auto keyer = orchestrator::PublishedKeyer::Create(kSecret);
  ASSERT_TRUE(keyer.ok());
  dir::Summary s;
  s.domain = "tenant-a";
  s.epoch = 3;
  s.keyed = true;
  s.key_id = keyer->id();
  s.filter = dir::BloomFilter(dir::SizeFor(2000, 1e-4));
  const co::Namespace ns = co::MakeNamespace("t", "m", "l");
  std::vector<co::PrefixKey> chain;
  co::PrefixKey parent{};
  for (std::uint32_t i = 0; i < 2000; ++i) {
    const std::uint32_t tokens[] = {static_cast<std::uint32_t>(rng()), i};
    parent = co::ChainKey(ns, i % 16 == 0 ? co::PrefixKey{} : parent, tokens);
    chain.push_back(parent);
    s.filter.Add(keyer->Apply(parent));
    ++s.anchors;
  }
  s.published = s.anchors;
  const std::string rec = dir::EncodeSummary(s);
  EXPECT_EQ(rec[4], 2);  // version 2: keyed
  auto back = dir::DecodeSummary(rec);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(back->keyed);
  EXPECT_EQ(back->key_id, keyer->id());
  // Without the secret: the raw chain keys are not in the filter (beyond its false positives,
  // 0.2 expected here), and a reader answers "cannot tell".
  std::size_t raw_hits = 0;
  for (const auto& k : chain) raw_hits += back->filter.MayContain(k) ? 1 : 0;
  EXPECT_LE(raw_hits, 3u);
  auto wrong = orchestrator::PublishedKeyer::Create(kSecret + "-other");
  ASSERT_TRUE(wrong.ok());
  for (const std::vector<orchestrator::PublishedKeyer>& ring :
       {std::vector<orchestrator::PublishedKeyer>{},
        std::vector<orchestrator::PublishedKeyer>{*wrong}}) {
    const dir::DomainAnswer a = dir::AnswerFor(*back, chain[7], ring, 0);
    EXPECT_TRUE(a.keyed);
    EXPECT_FALSE(a.key_held);
    EXPECT_FALSE(a.may_hold);
  }
  // With it: every key matches.
  const std::vector<orchestrator::PublishedKeyer> ring{*wrong, *keyer};
  for (const auto& k : chain) {
    const dir::DomainAnswer a = dir::AnswerFor(*back, k, ring, 0);
    ASSERT_TRUE(a.key_held);
    ASSERT_TRUE(a.may_hold);
  }
  // An unkeyed summary stays version 1, so readers of before keep reading it.
  s.keyed = false;
  EXPECT_EQ(dir::EncodeSummary(s)[4], 1);
  EXPECT_TRUE(dir::AnswerFor(*dir::DecodeSummary(dir::EncodeSummary(s)), chain[0], {}, 0).key_held);
}

TEST(Config, KeysSection) {
  const std::string base =
      "[domain]\nname = \"d\"\npool = \"file:/tmp/p?size=1G\"\n"
      "prefix_domain = \"file:/tmp/d?size=4M\"\nstate_file = \"/tmp/s\"\n"
      "[rpc]\nsocket = \"/tmp/o.sock\"\n";
  const std::string mine = SecretFile(kSecret), theirs = SecretFile(kSecret + "-b");
  auto c = orchestrator::ParseConfig(
      base + "[keys]\npublish_file = \"" + mine + "\"\ndirectory_files = [\"" + theirs + "\"]\n",
      "t.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->keys.publish_secret, kSecret);
  EXPECT_EQ(c->keys.directory_secrets, std::vector<std::string>{kSecret + "-b"});
  ASSERT_EQ(::chmod(mine.c_str(), 0644), 0);
  auto bad =
      orchestrator::ParseConfig(base + "[keys]\npublish_file = \"" + mine + "\"\n", "t.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("keys.publish_file"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("chmod 600"), std::string::npos) << bad.status();
  // Keyed by default (the domain's own key); keys.unkeyed opts out, and not beside a file.
  auto plain = orchestrator::ParseConfig(base, "t.toml");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->keys.unkeyed);
  EXPECT_TRUE(plain->keys.publish_secret.empty());
  auto opted = orchestrator::ParseConfig(base + kUnkeyed, "t.toml");
  ASSERT_TRUE(opted.ok()) << opted.status();
  EXPECT_TRUE(opted->keys.unkeyed);
  ASSERT_EQ(::chmod(mine.c_str(), 0600), 0);
  auto both = orchestrator::ParseConfig(
      base + "[keys]\nunkeyed = true\npublish_file = \"" + mine + "\"\n", "t.toml");
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("keys.unkeyed"), std::string::npos) << both.status();
  EXPECT_NE(both.status().message().find("drop one"), std::string::npos) << both.status();
  ::unlink(mine.c_str());
  ::unlink(theirs.c_str());
}

using DirectoryTest = EtcdDirectoryTest;

TEST_F(DirectoryTest, PublishedInAReportedForAOnlyFollowsRetireAndDiesWithTheLease) {
  const std::uint64_t seed = Seed();
  SCOPED_TRACE(absl::StrCat("CXLKV_SEED=", seed));
  // Unkeyed (the opt-out): readers match chain keys as they are (the keyed default below).
  OrchestratorProcess a(SmallDomain("dom-a", Extra() + kUnkeyed)),
      b(SmallDomain("dom-b", Extra() + kUnkeyed));
  ASSERT_TRUE(a.Start());
  ASSERT_TRUE(b.Start());
  dir::ReaderOptions ro;
  ro.client.endpoints = etcd_->endpoints();
  auto reader = dir::DirectoryReader::Open(ro);
  ASSERT_TRUE(reader.ok()) << reader.status();
  dir::DirectoryReader& r = **reader;
  ASSERT_TRUE(SoonTrue(
      [&] {
        return r.Domains() == std::vector<std::string>{"dom-a", "dom-b"};
      },
      milliseconds(10000)));

  const co::Namespace ns = co::MakeNamespace("t", "m", "l");
  std::mt19937_64 rng(seed);
  auto chain_key = [&](std::uint32_t i) {
    const std::uint32_t tokens[] = {i, static_cast<std::uint32_t>(rng()), 7};
    return co::ChainKey(ns, co::PrefixKey{}, tokens);
  };
  // B holds one block of its own.
  const co::PrefixKey kb = chain_key(1);
  ASSERT_TRUE(b.Publish(ns, kb, 1));
  ASSERT_TRUE(SoonTrue([&] { return MayHold(r, kb) == std::vector<std::string>{"dom-b"}; },
                       milliseconds(5000)));
  // A's keys: ones B's filter does not report (B's set no longer changes, nor its filter).
  std::vector<co::PrefixKey> ka;
  for (std::uint32_t i = 100; ka.size() < 20; ++i) {
    const co::PrefixKey k = chain_key(i);
    if (MayHold(r, k).empty()) ka.push_back(k);
  }
  for (std::uint32_t i = 0; i < ka.size(); ++i) ASSERT_TRUE(a.Publish(ns, ka[i], 10 + i));
  const co::PrefixKey k0 = ka[0];
  ASSERT_TRUE(SoonTrue(
      [&] {
        for (const auto& k : ka) {
          if (MayHold(r, k) != std::vector<std::string>{"dom-a"}) return false;
        }
        return true;
      },
      milliseconds(5000)))
      << "dom-a's summary did not come to report its 20 blocks (and only dom-a)";
  for (const dir::DomainAnswer& d : r.Where(k0)) {
    EXPECT_EQ(d.may_hold, d.domain == "dom-a") << d.domain;
    EXPECT_EQ(d.published, d.domain == "dom-a" ? 20u : 1u) << d.domain;
    EXPECT_GT(d.epoch, 0);
    EXPECT_LT(d.fp_rate, 0.01);
  }

  // No per-block keys in etcd: per domain a leader, a candidate, a state and a summary.
  auto etcd = etcd_->NewClient();
  auto all = etcd->Get("/cxlkv/", orchestrator::etcd::PrefixEnd("/cxlkv/"));
  ASSERT_TRUE(all.ok()) << all.status();
  std::set<std::string> keys;
  for (const auto& kv : all->kvs) keys.insert(kv.key);
  EXPECT_EQ(keys.size(), 8u);
  EXPECT_TRUE(keys.count("/cxlkv/v1/default/directory/dom-a"));
  EXPECT_TRUE(keys.count("/cxlkv/v1/default/directory/dom-b"));

  // cxlkvctl where: from etcd directly, and through dom-b's orchestrator.
  const std::string hex = coherence::FormatKey(k0);
  std::string eps;
  for (const auto& e : etcd_->endpoints()) eps += (eps.empty() ? "" : ",") + e;
  for (const std::string& how : {"--etcd " + eps, "--socket " + b.socket}) {
    const std::string out =
        RunCapture(absl::StrCat(CXLKV_CTL_BIN, " where ", hex, " ", how, " --json"));
    auto j = nlohmann::json::parse(out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << how << ": " << out;
    EXPECT_EQ(j["may_hold"], nlohmann::json::array({"dom-a"})) << how << ": " << out;
    EXPECT_EQ(j["prefix"], hex);
    EXPECT_EQ(j["domains"].size(), 2u) << out;
  }
  const std::string text =
      RunCapture(absl::StrCat(CXLKV_CTL_BIN, " where ", hex, " --socket ", a.socket));
  EXPECT_NE(text.find("may be held by dom-a"), std::string::npos) << text;

  // The C API, through dom-b's orchestrator.
  cxlkv_prefix_key ck{k0.lo, k0.hi};
  std::size_t need = 0;
  ASSERT_EQ(cxlkv_directory_where(b.socket.c_str(), &ck, nullptr, 0, &need), CXLKV_OK)
      << cxlkv_last_error();
  std::string buf(need + 256, '\0');
  ASSERT_EQ(cxlkv_directory_where(b.socket.c_str(), &ck, buf.data(), buf.size(), &need), CXLKV_OK)
      << cxlkv_last_error();
  auto cj = nlohmann::json::parse(buf.c_str());
  EXPECT_EQ(cj["may_hold"], nlohmann::json::array({"dom-a"})) << buf;
  char tiny[8];
  EXPECT_EQ(cxlkv_directory_where(b.socket.c_str(), &ck, tiny, sizeof(tiny), nullptr),
            CXLKV_E_INVALID);
  EXPECT_NE(cxlkv_directory_where("/nonexistent/o.sock", &ck, nullptr, 0, &need), CXLKV_OK);

  // The Python package, over the C call (unsanitized builds: python3 cannot load an
  // instrumented libcxlkv).
  if (CXLKV_TEST_PYTHON_LOADS_LIB) {
    const std::string py = RunCapture(absl::StrCat(
        "cd ", CXLKV_SOURCE_DIR, "/python && CXLKV_LIBRARY=", CXLKV_LIB,
        " /usr/bin/python3 -c 'import sys, cxlkv.directory as d; "
        "a = d.where(sys.argv[1], sys.argv[2]); print(\",\".join(a.may_hold), len(a.domains))' ",
        a.socket, " ", hex, " 2>&1"));
    EXPECT_EQ(py, "dom-a 2\n");
  }

  // A retire: the rebuilt filter drops the key.
  ASSERT_TRUE(a.Retire(ns, k0));
  EXPECT_TRUE(SoonTrue([&] { return MayHold(r, k0).empty(); }, milliseconds(5000)))
      << "dom-a's summary still reports a retired key";
  EXPECT_EQ(MayHold(r, ka[1]), std::vector<std::string>{"dom-a"});

  // kill -9 of dom-a's only orchestrator: its summary goes with its lease (TTL 2 s).
  const auto t0 = std::chrono::steady_clock::now();
  a.Stop(SIGKILL);
  ASSERT_TRUE(SoonTrue([&] { return r.Domains() == std::vector<std::string>{"dom-b"}; },
                       milliseconds(8000)))
      << "dom-a's summary outlived its leader's lease";
  const auto ms =
      std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0).count();
  std::printf("dom-a's summary vanished %lld ms after kill -9 (session TTL 2 s)\n",
              static_cast<long long>(ms));
  EXPECT_GE(ms, 1000) << "gone before the lease could have expired: deleted by someone else?";
  EXPECT_TRUE(MayHold(r, ka[1]).empty());
  EXPECT_EQ(MayHold(r, kb), std::vector<std::string>{"dom-b"});
}

// A domain with keys.publish_file: its summary in etcd holds K' only. A reader without the
// secret gets "keyed, secret not held" (never a verdict) and cannot find a known prompt's chain
// key in the raw filter; with the secret (a reader's publish_secrets, another orchestrator's
// keys.directory_files, cxlkvctl --key-file) the prompt matches. A domain without the secret
// in its config answers no-key.
TEST_F(DirectoryTest, KeyedDomainMatchesOnlyWithItsSecret) {
  const std::uint64_t seed = Seed();
  SCOPED_TRACE(absl::StrCat("CXLKV_SEED=", seed));
  const std::string key_file = SecretFile(kSecret);
  OrchestratorProcess a(
      SmallDomain("dom-k", Extra() + "[keys]\npublish_file = \"" + key_file + "\"\n"));
  OrchestratorProcess b(SmallDomain(
      "dom-r", Extra() + "[keys]\nunkeyed = true\ndirectory_files = [\"" + key_file + "\"]\n"));
  OrchestratorProcess c(SmallDomain("dom-x", Extra() + kUnkeyed));
  ASSERT_TRUE(a.Start());
  ASSERT_TRUE(b.Start());
  ASSERT_TRUE(c.Start());
  std::mt19937_64 rng(seed);
  const co::Namespace ns = co::MakeNamespace("t", "m", "l");
  const std::uint32_t tokens[] = {static_cast<std::uint32_t>(rng()), 1, 2};
  const co::PrefixKey k = co::ChainKey(ns, co::PrefixKey{}, tokens);
  ASSERT_TRUE(a.Publish(ns, k, 1));

  dir::ReaderOptions with;
  with.client.endpoints = etcd_->endpoints();
  with.publish_secrets = {kSecret};
  auto keyed_reader = dir::DirectoryReader::Open(with);
  ASSERT_TRUE(keyed_reader.ok()) << keyed_reader.status();
  ASSERT_TRUE(
      SoonTrue([&] { return MayHold(**keyed_reader, k) == std::vector<std::string>{"dom-k"}; },
               milliseconds(8000)))
      << "a reader holding the secret did not come to match the published prompt";
  dir::ReaderOptions without;
  without.client.endpoints = etcd_->endpoints();
  auto plain_reader = dir::DirectoryReader::Open(without);
  ASSERT_TRUE(plain_reader.ok()) << plain_reader.status();
  for (const dir::DomainAnswer& d : (*plain_reader)->Where(k)) {
    EXPECT_FALSE(d.may_hold) << d.domain;
    EXPECT_EQ(d.keyed, d.domain == "dom-k") << d.domain;
    EXPECT_EQ(d.key_held, d.domain != "dom-k") << d.domain;
  }
  // The raw record in etcd: the chain key is not in its filter, K' is.
  auto etcd = etcd_->NewClient();
  auto rec = etcd->Get(dir::SummaryKey("default", "dom-k"), "");
  ASSERT_TRUE(rec.ok()) << rec.status();
  ASSERT_EQ(rec->kvs.size(), 1u);
  auto summary = dir::DecodeSummary(rec->kvs[0].value);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_TRUE(summary->keyed);
  EXPECT_FALSE(summary->filter.MayContain(k));
  auto keyer = orchestrator::PublishedKeyer::Create(kSecret);
  ASSERT_TRUE(keyer.ok());
  EXPECT_EQ(summary->key_id, keyer->id());
  EXPECT_TRUE(summary->filter.MayContain(keyer->Apply(k)));

  // cxlkvctl where: from etcd with and without --key-file; through dom-r (keys.directory_files
  // holds the secret) and dom-x (it does not).
  const std::string hex = coherence::FormatKey(k);
  std::string eps;
  for (const auto& e : etcd_->endpoints()) eps += (eps.empty() ? "" : ",") + e;
  struct Case {
    std::string how;
    bool held;
  };
  for (const Case& cs :
       {Case{"--etcd " + eps + " --key-file " + key_file, true}, Case{"--etcd " + eps, false},
        Case{"--socket " + b.socket, true}, Case{"--socket " + c.socket, false}}) {
    const std::string out =
        RunCapture(absl::StrCat(CXLKV_CTL_BIN, " where ", hex, " ", cs.how, " --json"));
    auto j = nlohmann::json::parse(out, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << cs.how << ": " << out;
    EXPECT_EQ(j["may_hold"], cs.held ? nlohmann::json::array({"dom-k"}) : nlohmann::json::array())
        << cs.how << ": " << out;
    for (const auto& d : j["domains"]) {
      if (d["domain"] != "dom-k") continue;
      EXPECT_EQ(d["keyed"], true) << out;
      EXPECT_EQ(d["key_held"], cs.held) << cs.how << ": " << out;
    }
  }
  ::unlink(key_file.c_str());
}

TEST_F(DirectoryTest, SingleOrchestratorRefusesTheDirectoryCallSayingWhy) {
  OrchestratorProcess s(SmallDomain("solo", ""));
  ASSERT_TRUE(s.Start());
  cxlkv_prefix_key ck{1, 2};
  EXPECT_EQ(cxlkv_directory_where(s.socket.c_str(), &ck, nullptr, 0, nullptr), CXLKV_E_MISMATCH)
      << cxlkv_last_error();
  EXPECT_NE(std::string(cxlkv_last_error()).find("lives in etcd"), std::string::npos)
      << cxlkv_last_error();
}

}  // namespace
}  // namespace cxlkv::testing
