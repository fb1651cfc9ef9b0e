// Orchestrator HA (docs/ha.md, docs/lmcache.md "Fail-over"), the LMCache coordinator: it
// stops serving at its leader's write deadline, and fails over with its objects. The fixture:
// tests/ha/ha_test.h.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cxlkv/orchestrator/config.h"
#include "cxlkv/orchestrator/daemon.h"
#include "etcd_cluster.h"
#include "eventually.h"
#include "gtest/gtest.h"
#include "ha/ha_orchestrator.h"
#include "ha/ha_test.h"
#include "ha/http.h"
#include "ha/jumping_clock.h"
#include "nlohmann/json.hpp"
#include "orchestrator_process.h"
#include "temp_dir.h"

namespace cxlkv::testing {
namespace {

// The LMCache coordinator of a leader past its write deadline answers nothing (503), already
// before the election's step-down stands it by (held back here: the step-down waits for the
// orchestrator's lock, which the test holds): a deposed coordinator must not answer beside its
// successor's (docs/lmcache.md "Fail-over"). The gate is the one the daemon hands it
// (Orchestrator::LeadLmcache); forced open, /readyz answers 200 after the jump.
TEST_F(HaTest, LmcacheCoordinatorStopsServingAtTheWriteDeadline) {
  const cxlkv::testing::TempDir scratch("ha-lmcgate", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  const std::string token = "ha-test-lmcache-token-0123456789";
  std::ofstream(dir + "/tokens") << token << "\n";
  ::chmod((dir + "/tokens").c_str(), 0600);
  // A free port for the coordinator (lmcache.listen; the in-process daemon logs it only).
  const int probe = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::getsockname(probe, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);
  ::close(probe);
  auto c = orch::ParseConfig(
      InProcessToml(dir, "lmcgate", etcd_.get(),
                    "[lmcache]\nlisten = \"127.0.0.1:" + std::to_string(port) +
                        "\"\ntoken_file = \"" + dir +
                        "/tokens\"\nlayout_id = \"ha-test\"\nregion_size = \"16M\"\n"
                        "alignment = \"4K\"\n"),
      "lmcgate.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  JumpingClock clock;
  auto o = orch::Orchestrator::Open(
      *c, orch::OpenOptions{.new_domain = true, .clock = &clock, .write_back_agent = false});
  ASSERT_TRUE(o.ok()) << o.status();
  ASSERT_TRUE((*o)->Start().ok());
  ASSERT_TRUE(Eventually([&] { return Http(port, "GET", "/readyz", "").first == 200; },
                         milliseconds(10000)))
      << "the leader's coordinator never served";
  {
    orch::Orchestrator::Hold l(**o);
    clock.Jump(10'000);
    EXPECT_EQ(Http(port, "GET", "/readyz", "").first, 503)
        << "the coordinator answers past the leader's write deadline";
    const auto lookup = Http(port, "POST", "/v1/lookup", token, "{}");
    EXPECT_EQ(lookup.first, 503) << lookup.second;
    EXPECT_NE(lookup.second.find("write deadline passed"), std::string::npos) << lookup.second;
  }
  (*o)->Stop();
  o->reset();
}

// LMCache's coordinator on a domain with [etcd] (docs/lmcache.md "Fail-over"): only the leader
// serves it (a standby answers 503, /healthz aside); a writer finishes three objects through
// the leader and leaves a fourth reserved; after kill -9 of the leader the standby serves the
// same region epoch, the same handles and the bytes behind them, the open reservation
// finishes with its token, and new grants carry larger generations.
TEST_F(HaTest, LmcacheCoordinatorFailsOverWithItsObjects) {
  using nlohmann::json;
  const std::string token = "ha-test-lmcache-token-0123456789";
  const cxlkv::testing::TempDir scratch("ha-lmc", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string tokens = std::string(tmpl) + "/tokens";
  std::ofstream(tokens) << token << "\n";
  ::chmod(tokens.c_str(), 0600);
  HaOrchestrator a(d_, *etcd_, "a"), b(d_, *etcd_, "b");
  for (HaOrchestrator* o : {&a, &b}) {
    o->AppendConfig(absl::StrCat("[lmcache]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"", tokens,
                                 "\"\nlayout_id = \"ha-test\"\nregion_size = \"16M\"\n"
                                 "alignment = \"4K\"\n"));
  }
  ASSERT_TRUE(StartLeaderAndStandbys(a, {&b}));
  const int pa = a.LmcachePort(), pb = b.LmcachePort();
  ASSERT_GT(pa, 0) << SlurpFile(a.log);
  ASSERT_GT(pb, 0) << SlurpFile(b.log);
  ASSERT_TRUE(
      Eventually([&] { return Http(pa, "GET", "/readyz", "").first == 200; }, milliseconds(10000)))
      << SlurpFile(a.log);
  EXPECT_EQ(Http(pb, "GET", "/readyz", "").first, 503);
  EXPECT_EQ(Http(pb, "GET", "/healthz", "").first, 200);
  const auto refused = Http(pb, "POST", "/v1/lookup", token, "{}");
  EXPECT_EQ(refused.first, 503);
  EXPECT_NE(refused.second.find("the domain's leader does"), std::string::npos) << refused.second;

  auto call = [&](int port, const std::string& method, const std::string& path,
                  const json& body = nullptr) {
    const auto r = Http(port, method, path, token, body.is_null() ? "" : body.dump());
    EXPECT_EQ(r.first, 200) << method << " " << path << ": " << r.second;
    return json::parse(r.second, nullptr, false);
  };
  const json region = call(pa, "GET", "/v1/region");
  const std::string epoch = region.value("region_epoch", "");
  ASSERT_FALSE(epoch.empty()) << region;
  const std::uint64_t region_offset = call(pa, "GET", "/cxlkv/v1/stats").value("region_offset", 0);
  ASSERT_GT(region_offset, 0u);
  auto key = [](int i) {
    return json{
        {"chunk_hash_hex", absl::StrCat("0", i, "ab")}, {"model_name", "m"}, {"kv_rank", 0}};
  };
  json items = json::array();
  for (int i = 0; i < 4; ++i) {
    items.push_back(
        {{"key", key(i)}, {"layout", {{"shapes", {{1000 + 777 * i}}}, {"dtypes", {"uint8"}}}}});
  }
  const json grants =
      call(pa, "POST", "/v1/writes/reserve", {{"region_epoch", epoch}, {"items", items}})["grants"];
  ASSERT_EQ(grants.size(), 4u) << grants;
  // The bytes, written where the handles say in the pool every orchestrator maps.
  const int pool_fd = ::open(d_.pool.c_str(), O_RDWR);
  ASSERT_GE(pool_fd, 0);
  const std::size_t pool_bytes = 256u << 20;
  auto* pool = static_cast<std::uint8_t*>(
      ::mmap(nullptr, pool_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, pool_fd, 0));
  ::close(pool_fd);
  ASSERT_NE(pool, MAP_FAILED);
  auto byte_of = [](int i, std::uint64_t j, std::uint64_t gen) {
    return static_cast<std::uint8_t>((i * 31 + j * 7 + gen) & 0xff);
  };
  for (int i = 0; i < 4; ++i) {
    const json& h = grants[i]["handle"];
    for (std::uint64_t j = 0; j < h["length"].get<std::uint64_t>(); ++j) {
      pool[region_offset + h["offset"].get<std::uint64_t>() + j] =
          byte_of(i, j, h["generation"].get<std::uint64_t>());
    }
  }
  json done = json::array();
  for (int i = 0; i < 3; ++i) done.push_back({{"key", key(i)}, {"token", grants[i]["token"]}});
  call(pa, "POST", "/v1/writes/finish", {{"region_epoch", epoch}, {"reservations", done}});
  json keys = json::array();
  for (int i = 0; i < 4; ++i) keys.push_back(key(i));
  const json before = call(pa, "POST", "/v1/lookup", {{"region_epoch", epoch}, {"keys", keys}});
  const json used_before = call(pa, "GET", "/v1/status")["used_bytes"];
  // The three finished objects are in the domain's prefix index (the leader's owner loop
  // publishes them as its own entries).
  ASSERT_TRUE(Eventually([&] { return call(pa, "GET", "/cxlkv/v1/stats")["indexed"] == 3; },
                         milliseconds(5000)))
      << call(pa, "GET", "/cxlkv/v1/stats");

  a.Kill(SIGKILL);
  ASSERT_TRUE(
      Eventually([&] { return Http(pb, "GET", "/readyz", "").first == 200; }, milliseconds(15000)))
      << "the standby's coordinator did not take over:\n"
      << SlurpFile(b.log);
  EXPECT_EQ(call(pb, "GET", "/v1/region")["region_epoch"], epoch);
  EXPECT_EQ(call(pb, "GET", "/v1/status")["used_bytes"], used_before);
  const json after = call(pb, "POST", "/v1/lookup", {{"region_epoch", epoch}, {"keys", keys}});
  EXPECT_EQ(after["hits"], before["hits"]);
  ASSERT_EQ(after["hits"].size(), 4u) << after;
  EXPECT_TRUE(after["hits"][3].is_null()) << "a WRITING object is not a hit";
  for (int i = 0; i < 3; ++i) {
    const json& h = after["hits"][i]["handle"];
    ASSERT_EQ(h, grants[i]["handle"]) << i;
    std::uint64_t wrong = 0;
    for (std::uint64_t j = 0; j < h["length"].get<std::uint64_t>(); ++j) {
      wrong += pool[region_offset + h["offset"].get<std::uint64_t>() + j] !=
               byte_of(i, j, h["generation"].get<std::uint64_t>());
    }
    EXPECT_EQ(wrong, 0u) << "object " << i;
  }
  // The reservation left open before the failover finishes on the new leader.
  call(pb, "POST", "/v1/writes/finish",
       {{"region_epoch", epoch},
        {"reservations", {{{"key", key(3)}, {"token", grants[3]["token"]}}}}});
  const json hit3 = call(pb, "POST", "/v1/lookup", {{"region_epoch", epoch}, {"keys", {key(3)}}});
  EXPECT_EQ(hit3["hits"][0]["handle"], grants[3]["handle"]);
  // The successor found the three in the index it took over (none published twice), and
  // publishes the fourth.
  EXPECT_TRUE(Eventually([&] { return call(pb, "GET", "/cxlkv/v1/stats")["indexed"] == 4; },
                         milliseconds(5000)))
      << call(pb, "GET", "/cxlkv/v1/stats");
  EXPECT_EQ(call(pb, "GET", "/cxlkv/v1/stats")["index_skipped"], 0) << "a publish was refused";
  const json more = call(
      pb, "POST", "/v1/writes/reserve",
      {{"region_epoch", epoch},
       {"items", {{{"key", key(9)}, {"layout", {{"shapes", {{64}}}, {"dtypes", {"uint8"}}}}}}}});
  EXPECT_GT(more["grants"][0]["handle"]["generation"].get<std::uint64_t>(),
            grants[3]["handle"]["generation"].get<std::uint64_t>());
  EXPECT_NE(SlurpFile(b.log).find("restored from etcd"), std::string::npos) << SlurpFile(b.log);
  ::munmap(pool, pool_bytes);
}

}  // namespace
}  // namespace cxlkv::testing
