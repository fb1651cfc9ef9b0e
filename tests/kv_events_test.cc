// KV events for routers (docs/kv_events.md).
//
// KvEventEncoding: the msgpack EventBatch decoded again with msgpack-cxx, field by field in
// vLLM's documented order, in both event forms and both block-hash forms (label unit).
// KvEventsThroughTheOrchestrator: a real cxlkv-orchestrator with [events] publishing to a
// subscriber written on Debian's python3-zmq and python3-msgpack (tests/kv_events_sub.py,
// /usr/bin/python3), which decodes each event to vLLM's field order; blocks are published and
// retired by a host of the domain in this process through the real owner, and the
// orchestrator is killed and restarted (a new term: AllBlocksCleared, then what is published).
// Skipped when /usr/bin/python3 lacks zmq or msgpack (scripts/deps installs them).
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define MSGPACK_NO_BOOST 1
#include <cstdio>
#include <msgpack.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/orchestrator/kv_events.h"
#include "cxlkv/orchestrator/published_key.h"
#include "cxlkv/tier/reuse_tracker.h"
#include "gtest/gtest.h"
#include "kv_events_subscriber.h"
#include "nlohmann/json.hpp"
#include "orchestrator_process.h"
#include "temp_dir.h"

namespace cxlkv::testing {
namespace {

namespace co = ::cxlkv::coherence;
namespace ev = ::cxlkv::orchestrator::events;
using std::chrono::milliseconds;

msgpack::object_handle Unpack(const std::string& b) { return msgpack::unpack(b.data(), b.size()); }

std::string Str(const msgpack::object& o) {
  EXPECT_EQ(o.type, msgpack::type::STR);
  return std::string(o.via.str.ptr, o.via.str.size);
}

const co::PrefixKey kKey{0x0123456789abcdefull, 0xfedcba9876543210ull};

TEST(KvEventEncoding, PositionalEventsInVllmsFieldOrder) {
  ev::EncodeOptions o;  // array form, bytes hashes, block_size 16, rank 0
  const std::string b =
      ev::EncodeBatch(1700000000.5,
                      {{ev::KvEvent::Kind::kAllCleared, {}},
                       {ev::KvEvent::Kind::kStored, {kKey}},
                       {ev::KvEvent::Kind::kRemoved, {kKey, co::PrefixKey{1, 2}}}},
                      o);
  auto h = Unpack(b);
  const msgpack::object& batch = h.get();
  ASSERT_EQ(batch.type, msgpack::type::ARRAY);
  ASSERT_EQ(batch.via.array.size, 3u);  // [ts, events, data_parallel_rank]
  EXPECT_EQ(batch.via.array.ptr[0].type, msgpack::type::FLOAT64);
  EXPECT_DOUBLE_EQ(batch.via.array.ptr[0].via.f64, 1700000000.5);
  EXPECT_EQ(batch.via.array.ptr[2].as<int>(), 0);
  const msgpack::object_array& events = batch.via.array.ptr[1].via.array;
  ASSERT_EQ(events.size, 3u);

  const msgpack::object_array& cleared = events.ptr[0].via.array;
  ASSERT_EQ(cleared.size, 1u);
  EXPECT_EQ(Str(cleared.ptr[0]), "AllBlocksCleared");

  // ["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
  //  lora_name]
  const msgpack::object_array& stored = events.ptr[1].via.array;
  ASSERT_EQ(stored.size, 8u);
  EXPECT_EQ(Str(stored.ptr[0]), "BlockStored");
  ASSERT_EQ(stored.ptr[1].via.array.size, 1u);
  const msgpack::object& hash = stored.ptr[1].via.array.ptr[0];
  ASSERT_EQ(hash.type, msgpack::type::BIN);
  ASSERT_EQ(hash.via.bin.size, 16u);
  std::string hex;
  for (std::uint32_t i = 0; i < 16; ++i) {
    hex +=
        absl::StrCat(absl::Hex(static_cast<unsigned char>(hash.via.bin.ptr[i]), absl::kZeroPad2));
  }
  EXPECT_EQ(hex, coherence::FormatKey(kKey));   // the hex cxlkvctl prints
  EXPECT_TRUE(stored.ptr[2].is_nil());          // parent_block_hash
  EXPECT_EQ(stored.ptr[3].via.array.size, 0u);  // token_ids
  EXPECT_EQ(stored.ptr[4].as<int>(), 16);       // block_size
  EXPECT_TRUE(stored.ptr[5].is_nil());          // lora_id
  EXPECT_EQ(Str(stored.ptr[6]), "SHARED");      // medium
  EXPECT_TRUE(stored.ptr[7].is_nil());          // lora_name

  // ["BlockRemoved", block_hashes, medium]
  const msgpack::object_array& removed = events.ptr[2].via.array;
  ASSERT_EQ(removed.size, 3u);
  EXPECT_EQ(Str(removed.ptr[0]), "BlockRemoved");
  EXPECT_EQ(removed.ptr[1].via.array.size, 2u);
  EXPECT_EQ(Str(removed.ptr[2]), "SHARED");
}

TEST(KvEventEncoding, MapEventsAndIntegerHashes) {
  ev::EncodeOptions o;
  o.format = ev::EventFormat::kMap;
  o.hash = ev::HashForm::kUint64;
  o.block_size = 32;
  o.data_parallel_rank = std::nullopt;
  const std::string b = ev::EncodeBatch(
      2.0, {{ev::KvEvent::Kind::kStored, {kKey}}, {ev::KvEvent::Kind::kRemoved, {kKey}}}, o);
  auto h = Unpack(b);
  const msgpack::object& batch = h.get();
  ASSERT_EQ(batch.via.array.size, 3u);
  EXPECT_TRUE(batch.via.array.ptr[2].is_nil());
  const msgpack::object_array& events = batch.via.array.ptr[1].via.array;
  ASSERT_EQ(events.size, 2u);
  const msgpack::object_map& stored = events.ptr[0].via.map;
  const std::vector<std::string> names = {"type",      "block_hashes", "parent_block_hash",
                                          "token_ids", "block_size",   "lora_id",
                                          "medium",    "lora_name"};
  ASSERT_EQ(stored.size, names.size());
  for (std::uint32_t i = 0; i < stored.size; ++i) EXPECT_EQ(Str(stored.ptr[i].key), names[i]);
  EXPECT_EQ(Str(stored.ptr[0].val), "BlockStored");
  EXPECT_EQ(stored.ptr[1].val.via.array.ptr[0].as<std::uint64_t>(), kKey.lo);
  EXPECT_EQ(stored.ptr[4].val.as<int>(), 32);
  EXPECT_EQ(Str(stored.ptr[6].val), "SHARED");
  const msgpack::object_map& removed = events.ptr[1].via.map;
  ASSERT_EQ(removed.size, 3u);
  EXPECT_EQ(Str(removed.ptr[0].val), "BlockRemoved");
  EXPECT_EQ(Str(removed.ptr[2].key), "medium");
}

TEST(KvEventsThroughTheOrchestrator, StoredRemovedAndANewTermDecodedByPython) {
  if (!PythonHasZmqAndMsgpack()) {
    GTEST_SKIP() << "/usr/bin/python3 lacks zmq or msgpack: apt-get install python3-zmq "
                    "python3-msgpack (scripts/deps does)";
  }
  const cxlkv::testing::TempDir scratch("kvev", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  Subscriber sub(dir, "cxlkv/ev-dom");
  const int port = sub.Port();
  ASSERT_NE(port, 0) << "the subscriber did not start";
  OrchestratorProcess o(
      SmallDomain("ev-dom", absl::StrCat("[events]\nendpoint = \"tcp://127.0.0.1:", port,
                                         "\"\ninterval_ms = 20\nblock_size = 16\n")));
  ASSERT_TRUE(o.Start());
  // The first term opens with AllBlocksCleared (nothing is published yet).
  ASSERT_TRUE(SoonTrue([&] { return !sub.Messages().empty(); }, milliseconds(5000)))
      << "no event batch arrived";
  {
    const auto m = sub.Messages();
    EXPECT_EQ(m[0]["topic"], "cxlkv/ev-dom");
    EXPECT_EQ(m[0]["seq"], 0);
    EXPECT_EQ(m[0]["rank"], 0);
    EXPECT_EQ(m[0]["form"], nlohmann::json::array({"array"}));
    ASSERT_EQ(m[0]["events"].size(), 1u);
    EXPECT_EQ(m[0]["events"][0]["type"], "AllBlocksCleared");
  }
  // No [keys]: the keys leave keyed with the domain's own secret, which its owner created and a
  // router gets with `cxlkvctl publish-key`.
  const std::string secret = DomainPublishKey(CXLKV_CTL_BIN, o);
  ASSERT_EQ(secret.size(), 64u) << "cxlkvctl publish-key gave '" << secret << "'";
  auto keyer = orchestrator::PublishedKeyer::Create(secret);
  ASSERT_TRUE(keyer.ok()) << keyer.status();
  const co::Namespace ns = co::MakeNamespace("t", "m", "l");
  const std::uint32_t t1[] = {1, 2, 3}, t2[] = {4, 5, 6};
  const co::PrefixKey k1 = co::ChainKey(ns, co::PrefixKey{}, t1);
  const co::PrefixKey k2 = co::ChainKey(ns, k1, t2);
  const std::string raw1 = coherence::FormatKey(k1), raw2 = coherence::FormatKey(k2);
  const std::string h1 = coherence::FormatKey(keyer->Apply(k1)),
                    h2 = coherence::FormatKey(keyer->Apply(k2));
  ASSERT_TRUE(o.Publish(ns, k1, 1));
  ASSERT_TRUE(o.Publish(ns, k2, 2));
  ASSERT_TRUE(SoonTrue([&] { return HasStored(sub.Events(), h1) && HasStored(sub.Events(), h2); },
                       milliseconds(5000)))
      << "BlockStored for both blocks did not arrive";
  for (const auto& e : sub.Events()) {
    if (e["type"] != "BlockStored") continue;
    EXPECT_EQ(e["_positional"], 7);  // the 7 fields vLLM has without defaults
    EXPECT_TRUE(e["parent_block_hash"].is_null());
    EXPECT_EQ(e["token_ids"], nlohmann::json::array());
    EXPECT_EQ(e["block_size"], 16);
    EXPECT_TRUE(e["lora_id"].is_null());
    EXPECT_EQ(e["medium"], "SHARED");
    EXPECT_TRUE(e["lora_name"].is_null());
  }
  // A retire: BlockRemoved naming the block.
  ASSERT_TRUE(o.Retire(ns, k1));
  ASSERT_TRUE(SoonTrue(
      [&] {
        for (const auto& e : sub.Events()) {
          if (e["type"] == "BlockRemoved" && e["block_hashes"] == nlohmann::json::array({h1}) &&
              e["medium"] == "SHARED") {
            return true;
          }
        }
        return false;
      },
      milliseconds(5000)))
      << "BlockRemoved did not arrive";
  // Sequence numbers count up without a gap.
  const auto before = sub.Messages();
  for (std::size_t i = 0; i < before.size(); ++i) EXPECT_EQ(before[i]["seq"], i);
  for (const auto& m : before) EXPECT_FALSE(m.contains("error")) << m.dump();

  // kill -9 and a restart: a new term opens with AllBlocksCleared, then what the index still
  // holds (k2; k1 is retired), under the same key: the domain keeps it.
  o.Stop(SIGKILL);
  ASSERT_TRUE(o.Start());
  EXPECT_EQ(DomainPublishKey(CXLKV_CTL_BIN, o), secret);
  const std::size_t from = before.size();
  ASSERT_TRUE(SoonTrue([&] { return HasStored(sub.Events(from), h2); }, milliseconds(8000)))
      << "the new term did not announce the published block";
  const auto after = sub.Events(from);
  ASSERT_GE(after.size(), 2u);
  EXPECT_EQ(after[0]["type"], "AllBlocksCleared");
  EXPECT_FALSE(HasStored(after, h1));
  // No event ever named a chain key a subscriber could compute from a known prompt.
  for (const auto& e : sub.Events()) {
    const std::string text = e.dump();
    EXPECT_EQ(text.find(raw1), std::string::npos) << text;
    EXPECT_EQ(text.find(raw2), std::string::npos) << text;
  }
}

TEST(KvEventsThroughTheOrchestrator, MapFormAsNewerVllm) {
  if (!PythonHasZmqAndMsgpack()) GTEST_SKIP() << "/usr/bin/python3 lacks zmq or msgpack";
  const cxlkv::testing::TempDir scratch("kvev", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  // A configured topic. Not llm-d's kv@ form: the config refuses the map form with it, as
  // llm-d v0.8.1 drops map-form messages (orchestrator_test's Config.ErrorsNameTheKeyAndLine).
  Subscriber sub(dir, "router/");
  const int port = sub.Port();
  ASSERT_NE(port, 0);
  OrchestratorProcess o(
      SmallDomain("ev-map", absl::StrCat("[events]\nendpoint = \"tcp://127.0.0.1:", port,
                                         "\"\nformat = \"map\"\nblock_hash = \"uint64\"\n"
                                         "topic = \"router/cxl-rack-3\"\n"
                                         "medium = \"shared_storage\"\n"
                                         "data_parallel_rank = 2\n"
                                         // The opt-out: chain keys leave as they are.
                                         "[keys]\nunkeyed = true\n")));
  ASSERT_TRUE(o.Start());
  const co::Namespace ns = co::MakeNamespace("t", "m", "l");
  const std::uint32_t t1[] = {9, 9, 9};
  const co::PrefixKey k = co::ChainKey(ns, co::PrefixKey{}, t1);
  ASSERT_TRUE(SoonTrue([&] { return !sub.Messages().empty(); }, milliseconds(5000)));
  ASSERT_TRUE(o.Publish(ns, k, 1));
  ASSERT_TRUE(SoonTrue(
      [&] {
        for (const auto& e : sub.Events()) {
          if (e["type"] == "BlockStored" && e["block_hashes"] == nlohmann::json::array({k.lo}) &&
              e["medium"] == "shared_storage") {
            return true;
          }
        }
        return false;
      },
      milliseconds(5000)));
  const auto m = sub.Messages();
  EXPECT_EQ(m[0]["topic"], "router/cxl-rack-3");
  EXPECT_EQ(m[0]["rank"], 2);
  EXPECT_EQ(m.back()["form"], nlohmann::json::array({"map"}));
}

// `cxlkvctl publish-key` says why there is no key to hand out, and never creates a domain: a
// domain that opts out (keys.unkeyed), one keyed with the operator's file, one whose
// prefix_domain does not exist (it stays absent), one not formatted yet.
TEST(KvEventsThroughTheOrchestrator, PublishKeyNamesWhyThereIsNoKey) {
  const cxlkv::testing::TempDir scratch("kvpk", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string dir = scratch.path();
  auto run = [&](const std::string& keys, const std::string& domain_spec) {
    const std::string conf = dir + "/domain.toml";
    std::FILE* f = std::fopen(conf.c_str(), "w");
    EXPECT_NE(f, nullptr);
    std::fputs(
        absl::StrCat("[domain]\nname = \"pk\"\npool = \"file:", dir,
                     "/pool?size=1G\"\nprefix_domain = \"", domain_spec, "\"\nstate_file = \"", dir,
                     "/state\"\n[rpc]\nsocket = \"", dir, "/o.sock\"\n", keys)
            .c_str(),
        f);
    std::fclose(f);
    return RunCapture(
        absl::StrCat(CXLKV_CTL_BIN, " publish-key --config ", conf, " 2>&1; echo rc=$?"));
  };
  const std::string missing = dir + "/no-domain";
  std::string out = run("[keys]\nunkeyed = true\n", "file:" + missing + "?size=4M");
  EXPECT_NE(out.find("keys.unkeyed"), std::string::npos) << out;
  EXPECT_NE(out.find("rc=1"), std::string::npos) << out;
  out = run("", "file:" + missing + "?size=4M");
  EXPECT_NE(out.find("does not exist"), std::string::npos) << out;
  EXPECT_NE(out.find("start the domain's orchestrator once"), std::string::npos) << out;
  EXPECT_NE(out.find("rc=1"), std::string::npos) << out;
  struct stat st {};
  EXPECT_NE(::stat(missing.c_str(), &st), 0) << "publish-key created " << missing;
  // A file of the right size that no orchestrator formatted: no domain, so no key.
  const std::string blank = dir + "/blank";
  {
    std::FILE* f = std::fopen(blank.c_str(), "w");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(::ftruncate(::fileno(f), 4 << 20), 0);
    std::fclose(f);
  }
  out = run("", "file:" + blank + "?size=4M");
  EXPECT_NE(out.find("start the domain's orchestrator once"), std::string::npos) << out;
  EXPECT_NE(out.find("rc=1"), std::string::npos) << out;
}

// keys.publish_file set: events carry K' (published_key.h), never the chain key. A subscriber
// without the secret cannot match a prompt it knows; one with the secret computes K' from its
// own chain key and matches (python/cxlkv/keys.py's published_key computes the same K').
TEST(KvEventsThroughTheOrchestrator, KeyedHashesMatchOnlyWithTheSecret) {
  if (!PythonHasZmqAndMsgpack()) GTEST_SKIP() << "/usr/bin/python3 lacks zmq or msgpack";
  const cxlkv::testing::TempDir scratch("kvev", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  const std::string secret = "kv-events-test-secret-6d1f0c2e", key_file = dir + "/publish.key";
  {
    std::FILE* f = std::fopen(key_file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs((secret + "\n").c_str(), f);
    std::fclose(f);
    ASSERT_EQ(::chmod(key_file.c_str(), 0600), 0);
  }
  Subscriber sub(dir, "cxlkv/ev-keyed");
  const int port = sub.Port();
  ASSERT_NE(port, 0);
  OrchestratorProcess o(SmallDomain(
      "ev-keyed",
      absl::StrCat("[events]\nendpoint = \"tcp://127.0.0.1:", port,
                   "\"\ninterval_ms = 20\n[keys]\npublish_file = \"", key_file, "\"\n")));
  ASSERT_TRUE(o.Start());
  const co::Namespace ns = co::MakeNamespace("t", "m", "l");
  const std::uint32_t t1[] = {1, 2, 3}, t2[] = {4, 5, 6};
  const co::PrefixKey k1 = co::ChainKey(ns, co::PrefixKey{}, t1);
  const co::PrefixKey k2 = co::ChainKey(ns, k1, t2);
  auto keyer = orchestrator::PublishedKeyer::Create(secret);
  ASSERT_TRUE(keyer.ok()) << keyer.status();
  const std::string raw1 = coherence::FormatKey(k1), raw2 = coherence::FormatKey(k2);
  const std::string h1 = coherence::FormatKey(keyer->Apply(k1)),
                    h2 = coherence::FormatKey(keyer->Apply(k2));
  ASSERT_TRUE(SoonTrue([&] { return !sub.Messages().empty(); }, milliseconds(5000)));
  ASSERT_TRUE(o.Publish(ns, k1, 1));
  ASSERT_TRUE(o.Publish(ns, k2, 2));
  // With the secret: both blocks match.
  ASSERT_TRUE(SoonTrue([&] { return HasStored(sub.Events(), h1) && HasStored(sub.Events(), h2); },
                       milliseconds(5000)))
      << "BlockStored under the keyed hashes did not arrive";
  ASSERT_TRUE(o.Retire(ns, k1));
  ASSERT_TRUE(SoonTrue(
      [&] {
        for (const auto& e : sub.Events()) {
          if (e["type"] == "BlockRemoved" && e["block_hashes"] == nlohmann::json::array({h1})) {
            return true;
          }
        }
        return false;
      },
      milliseconds(5000)))
      << "BlockRemoved under the keyed hash did not arrive";
  // Without it: no event names a chain key the subscriber could compute from a known prompt.
  for (const auto& e : sub.Events()) {
    const std::string text = e.dump();
    EXPECT_EQ(text.find(raw1), std::string::npos) << text;
    EXPECT_EQ(text.find(raw2), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace cxlkv::testing
