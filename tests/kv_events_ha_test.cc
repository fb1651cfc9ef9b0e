// KV events with orchestrator HA (docs/kv_events.md, docs/ha.md): real etcd (3 members,
// tests/etcd_cluster.h), two orchestrators of one domain with [events] publishing to the
// python3-zmq/msgpack subscriber (tests/kv_events_sub.py). Only the leader publishes; after
// kill -9 of the leader the standby opens a new term with AllBlocksCleared and what the index
// holds, and rewrites the directory summary at a higher epoch; a standby answers the Directory
// RPC. Built where both the etcd client and KV events are; skipped without etcd or without
// python3-zmq / python3-msgpack.
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/cxlkv.h"
#include "cxlkv/orchestrator/directory_reader.h"
#include "cxlkv/orchestrator/published_key.h"
#include "cxlkv/tier/reuse_tracker.h"
#include "directory_fixture.h"
#include "etcd_cluster.h"
#include "gtest/gtest.h"
#include "kv_events_subscriber.h"
#include "nlohmann/json.hpp"
#include "orchestrator_process.h"
#include "temp_dir.h"

namespace cxlkv::testing {
namespace {

namespace co = ::cxlkv::coherence;
namespace dir = ::cxlkv::orchestrator::directory;
using std::chrono::milliseconds;

using KvEventsHaTest = EtcdDirectoryTest;

TEST_F(KvEventsHaTest, OnlyTheLeaderPublishesEventsAndATakeoverOpensANewTerm) {
  if (!PythonHasZmqAndMsgpack()) GTEST_SKIP() << "/usr/bin/python3 lacks zmq or msgpack";
  const cxlkv::testing::TempDir scratch("haev", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string tmp = tmpl;
  Subscriber sub(tmp, "cxlkv/ha-ev");
  const int port = sub.Port();
  ASSERT_NE(port, 0);
  const std::string events =
      absl::StrCat("[events]\nendpoint = \"tcp://127.0.0.1:", port, "\"\ninterval_ms = 20\n");
  OrchestratorProcess a(SmallDomain("ha-ev", Extra() + events));
  ASSERT_TRUE(a.Start());
  // No [keys]: the events and the summary are keyed with the domain's own secret, which the
  // first leader created at its takeover; every later leader keys with the same one.
  std::string secret;
  ASSERT_TRUE(SoonTrue(
      [&] {
        secret = DomainPublishKey(CXLKV_CTL_BIN, a);
        return !secret.empty();
      },
      milliseconds(10000)))
      << "the leader did not create the domain's publish key";
  auto keyer = orchestrator::PublishedKeyer::Create(secret);
  ASSERT_TRUE(keyer.ok()) << keyer.status();
  dir::ReaderOptions ro;
  ro.client.endpoints = etcd_->endpoints();
  ro.publish_secrets = {secret};
  auto reader = dir::DirectoryReader::Open(ro);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE(SoonTrue([&] { return (*reader)->Domains() == std::vector<std::string>{"ha-ev"}; },
                       milliseconds(10000)));
  OrchestratorProcess b(SmallDomain("ha-ev", Extra() + events), &a);
  ASSERT_TRUE(b.Start());
  const co::Namespace ns = co::MakeNamespace("t", "m", "l");
  const std::uint32_t tokens[] = {5, 6, 7};
  const co::PrefixKey k = co::ChainKey(ns, co::PrefixKey{}, tokens);
  const std::string hex = coherence::FormatKey(keyer->Apply(k));
  ASSERT_TRUE(a.Publish(ns, k, 1));
  ASSERT_TRUE(SoonTrue([&] { return HasStored(sub.Events(), hex); }, milliseconds(5000)));
  // The standby answers the directory.
  ASSERT_TRUE(SoonTrue([&] { return MayHold(**reader, k) == std::vector<std::string>{"ha-ev"}; },
                       milliseconds(5000)));
  cxlkv_prefix_key ck{k.lo, k.hi};
  std::string buf(4096, '\0');
  ASSERT_EQ(cxlkv_directory_where(b.socket.c_str(), &ck, buf.data(), buf.size(), nullptr), CXLKV_OK)
      << cxlkv_last_error();
  EXPECT_EQ(nlohmann::json::parse(buf.c_str())["may_hold"], nlohmann::json::array({"ha-ev"}));
  // Past the standby's settle time: still one term's opening only.
  std::this_thread::sleep_for(milliseconds(700));
  auto clears = [&](const std::vector<nlohmann::json>& ms) {
    std::vector<std::int64_t> seqs;
    for (const auto& m : ms) {
      for (const auto& e : m["events"]) {
        if (e["type"] == "AllBlocksCleared") seqs.push_back(m["seq"].get<std::int64_t>());
      }
    }
    return seqs;
  };
  ASSERT_EQ(clears(sub.Messages()).size(), 1u) << "a standby published";
  const std::size_t before = sub.Messages().size();
  const std::int64_t epoch_a = (*reader)->Where(k)[0].epoch;

  a.Stop(SIGKILL);
  ASSERT_TRUE(SoonTrue([&] { return clears(sub.Messages()).size() == 2; }, milliseconds(10000)))
      << "the new leader did not open a term";
  // The new leader's publisher never sent before: its first message is sequence 0.
  EXPECT_EQ(clears(sub.Messages())[1], 0);
  ASSERT_TRUE(SoonTrue([&] { return HasStored(sub.Events(before), hex); }, milliseconds(5000)))
      << "the new term did not announce the block still published";
  ASSERT_TRUE(SoonTrue(
      [&] {
        const auto w = (*reader)->Where(k);
        return w.size() == 1 && w[0].epoch > epoch_a && w[0].may_hold;
      },
      milliseconds(5000)))
      << "the new leader did not rewrite the summary";
}

}  // namespace
}  // namespace cxlkv::testing
