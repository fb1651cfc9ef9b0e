// orchestrator/: the configuration parser and the membership + capacity state machine.
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cxlkv/orchestrator/config.h"
#include "cxlkv/orchestrator/state.h"
#include "gtest/gtest.h"
#include "temp_dir.h"

namespace cxlkv::orchestrator {
namespace {

const char kMinimal[] = R"(
[domain]
pool = "file:/dev/shm/p?size=1G"
prefix_domain = "memfd:?size=16M"
extent_size = "64M"
state_file = "/tmp/x.state"
[rpc]
socket = "/tmp/x.sock"
)";

std::string WithExtra(const std::string& extra) { return std::string(kMinimal) + extra; }

TEST(Config, MinimalAndExampleParse) {
  auto c = ParseConfig(kMinimal, "t.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->extent_bytes, 64ull << 20);
  EXPECT_EQ(c->host_ttl_ms, 2000u);
  EXPECT_TRUE(c->HostAllowed(7));
  EXPECT_FALSE(c->HostAllowed(8)) << "max_hosts 8";
  auto ex = LoadConfig(std::string(CXLKV_SOURCE_DIR) + "/orchestrator/domain.example.toml");
  ASSERT_TRUE(ex.ok()) << ex.status();
  EXPECT_EQ(ex->namespaces.size(), 2u);
  EXPECT_EQ(ex->namespaces[0].pin, 2);
  EXPECT_DOUBLE_EQ(ex->ShareOf(0), 0.75);
  EXPECT_DOUBLE_EQ(ex->ShareOf(3), 0.5);
}

// Each bad input names the key and its line.
TEST(Config, ErrorsNameTheKeyAndLine) {
  struct Case {
    std::string text, want;
  } cases[] = {
      {WithExtra("[timing]\nlease_tll_ms = 5\n"),
       "t.toml:10: key 'timing.lease_tll_ms': unknown key"},
      {WithExtra("[timing]\nhost_ttl_ms = \"2s\"\n"),
       "t.toml:10: key 'timing.host_ttl_ms': expected an integer"},
      {WithExtra("[timing]\ngrace_ms = -1\n"),
       "t.toml:10: key 'timing.grace_ms': -1 is out of range"},
      // Audit-ha #6: the grace period carries rule 4 since the acquire's fences were merged.
      {WithExtra("[timing]\ngrace_ms = 0\n"),
       "t.toml:10: key 'timing.grace_ms': 0 is out of range"},
      {WithExtra("[capacity]\ndefault_share = 1.5\n"),
       "key 'capacity.default_share': 1.5 is out of range"},
      {WithExtra("[capacity.shares]\nabc = 0.5\n"), "keys of [capacity.shares] are host ids"},
      {WithExtra("[[namespace]]\ntenant = \"a\"\n"), "needs tenant, model and layout"},
      {WithExtra("[hosts]\nallowed = [1, 9]\n"), "host id 9 is not below domain.max_hosts"},
      {WithExtra("[timing]\nheartbeat_period_ms = 1000\n"), "at most host_ttl_ms / 4"},
      {"[domain]\npool = \"tape:/dev/st0\"\n", "t.toml:2: key 'domain.pool':"},
      {"[domain]\npool = \"memfd:?size=1G\"\n", "key 'domain.prefix_domain' is required"},
      {"[domain\n", "t.toml:1:"},
      {WithExtra("extra = 1\n"),
       "t.toml:9: key 'rpc.extra': unknown key (known here: allowed_uids, socket, tcp, tls_cert, "
       "tls_key, token_file)"},
      {"extra = 1\n" + std::string(kMinimal), "t.toml:1: key 'extra': unknown key"},
      // llm-d v0.8.1's topic and decoder (docs/kv_events.md, "What the routers read").
      {WithExtra("[events]\nendpoint = \"ipc:///tmp/e\"\ntopic = \"kv@dom1@m\"\n"
                 "format = \"map\"\n"),
       "key 'events.format': \"map\" with the llm-d topic 'kv@dom1@m': llm-d v0.8.1 decodes "
       "events only as arrays"},
      {WithExtra("[events]\nendpoint = \"ipc:///tmp/e\"\ntopic = \"kv@dom1\"\n"),
       "key 'events.topic': 'kv@dom1' starts with llm-d's kv@ but is not kv@<pod>@<model>"},
  };
  for (const Case& c : cases) {
    auto got = ParseConfig(c.text, "t.toml");
    ASSERT_FALSE(got.ok()) << c.text;
    EXPECT_TRUE(absl::IsInvalidArgument(got.status()));
    EXPECT_NE(got.status().message().find(c.want), std::string::npos)
        << "got: " << got.status().message() << "\nwant: " << c.want;
  }
}

// [placement] is tier/'s (tier/placement_config.h): the Config carries what it parsed, and its
// errors come back through ParseConfig with the key and line.
TEST(Config, PlacementSectionComesFromTier) {
  auto c = ParseConfig(WithExtra("[placement]\nttft_budget_ms = 250\ntracker_entries = 1024\n"
                                 "calibration = \"/tmp/cal.json\"\n"),
                       "t.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->placement.params.ttft_budget_s, 0.25);
  EXPECT_EQ(c->placement.reuse_tracker.entries, 1024u);
  EXPECT_EQ(c->placement.calibration, "/tmp/cal.json");
  auto bad =
      ParseConfig(WithExtra("[placement]\nlow_watermark = 0.9\nhigh_watermark = 0.5\n"), "t.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("t.toml:11: key 'placement.high_watermark': 0.5 must be "
                                        "above low_watermark (0.9)"),
            std::string::npos)
      << bad.status();
  auto ex = LoadConfig(std::string(CXLKV_SOURCE_DIR) + "/orchestrator/domain.example.toml");
  ASSERT_TRUE(ex.ok()) << ex.status();
  EXPECT_EQ(ex->placement.params.nvme_drive_bytes, 7.68e12);
  EXPECT_EQ(*ex->PinLevelOf(ex->namespaces[0].Name()), 2);
  EXPECT_NE(ex->PinLevelOf("acme/m/x").status().message().find("known: "), std::string::npos);
}

// rpc.tcp needs a token file that only its owner can read; TLS needs both halves.
TEST(Config, TcpNeedsAPrivateTokenFile) {
  const cxlkv::testing::TempDir scratch("token");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string dir = scratch.path();
  const std::string good = dir + "/good", open = dir + "/open", shorty = dir + "/short";
  std::ofstream(good) << "  0123456789abcdef-token  \n";
  std::ofstream(open) << "0123456789abcdef-token\n";
  std::ofstream(shorty) << "tiny\n";
  std::filesystem::permissions(good, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  std::filesystem::permissions(shorty, std::filesystem::perms::owner_read);
  std::filesystem::permissions(open, std::filesystem::perms::owner_read | std::filesystem::perms::others_read);
  auto rpc = [&](const std::string& extra) {
    std::string t = kMinimal;
    return t.insert(t.find("socket = "), extra);
  };
  auto ok = ParseConfig(rpc("tcp = \"0.0.0.0:7443\"\ntoken_file = \"" + good + "\"\n"), "t.toml");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->token, "0123456789abcdef-token") << "trimmed";
  struct Case {
    std::string text, want;
  } cases[] = {
      {rpc("tcp = \"0.0.0.0:7443\"\n"), "'rpc.token_file' is required with rpc.tcp"},
      {rpc("tcp = \"7443\"\ntoken_file = \"" + good + "\"\n"), "is not HOST:PORT"},
      {rpc("tcp = \"0.0.0.0:7443\"\ntoken_file = \"" + open + "\"\n"), "chmod 600"},
      {rpc("tcp = \"0.0.0.0:7443\"\ntoken_file = \"" + shorty + "\"\n"), "16 to 4096 characters"},
      {rpc("tcp = \"0.0.0.0:7443\"\ntoken_file = \"" + dir + "/none\"\n"), "head -c 32 /dev/urandom"},
      {rpc("token_file = \"" + good + "\"\n"), "apply to rpc.tcp, which is not set"},
      {rpc("tcp = \"0.0.0.0:7443\"\ntoken_file = \"" + good + "\"\ntls_cert = \"c.pem\"\n"),
       "go together"},
  };
  for (const Case& c : cases) {
    auto got = ParseConfig(c.text, "t.toml");
    ASSERT_FALSE(got.ok()) << c.text;
    EXPECT_NE(got.status().message().find(c.want), std::string::npos)
        << "got: " << got.status().message() << "\nwant: " << c.want;
  }
}

// Issue #33: each bad input -> the exact expectation that the message names the object (the
// key, or both keys) and states the fix. The table keeps the messages honest: a message that
// loses its object or its fix fails here.
TEST(Config, BadInputNamesTheObjectAndTheFix) {
  const std::string pool = "pool = \"file:/dev/shm/p?size=1G\"\n";
  const std::string dom = "prefix_domain = \"memfd:?size=16M\"\n";
  const std::string tail = "extent_size = \"64M\"\nstate_file = \"/tmp/x.state\"\n";
  const std::string sock = "[rpc]\nsocket = \"/tmp/x.sock\"\n";
  auto conf = [&](const std::string& p, const std::string& d, const std::string& more = "",
                  const std::string& socket = "") {
    return "[domain]\n" + p + d + tail + more + (socket.empty() ? sock : socket);
  };
  struct Case {
    std::string text;
    std::vector<std::string> want;  // the object(s), then the fix
  } cases[] = {
      // Regions against each other: the same file (by name, however spelled), overlapping
      // windows.
      {conf(pool, "prefix_domain = \"file:/dev/shm/p?size=1G\"\n"),
       {"keys 'domain.pool' and 'domain.prefix_domain' name the same memory (/dev/shm/p",
        "Give the prefix domain a file or device of its own, or give both windows that do not "
        "overlap"}},
      {conf(pool, "prefix_domain = \"file:/dev/shm/./p\"\n"),
       {"keys 'domain.pool' and 'domain.prefix_domain' name the same memory", "of its own"}},
      {conf("pool = \"devdax:/dev/dax0.0?offset=0&length=1G\"\n",
            "prefix_domain = \"devdax:/dev/dax0.0?offset=512M&length=64M\"\n"),
       {"keys 'domain.pool' and 'domain.prefix_domain'",
        "bytes [0, 1073741824) and [536870912, "
        "603979776)",
        "windows that do not overlap"}},
      // Arithmetic that needs no device.
      {conf(pool, "prefix_domain = \"file:/dev/shm/d?size=10000\"\n"),
       {"key 'domain.prefix_domain': size 10000 is not a multiple of the 4096-byte page",
        "round it up to 12288"}},
      {conf("pool = \"file:/dev/shm/p?size=32M\"\n", dom),
       {"key 'domain.extent_size': 67108864 bytes is larger than domain.pool (33554432 bytes)",
        "lower extent_size or give the pool a larger size="}},
      {conf(pool, "prefix_domain = \"memfd:?size=64K\"\n"),
       {"key 'domain.prefix_domain': 65536 bytes cannot hold this geometry",
        "give it size=", "or lower index_entries"}},
      {conf(pool, dom, "", "[rpc]\nsocket = \"/tmp/" + std::string(120, 's') + "\"\n"),
       {"key 'rpc.socket'", "a Unix socket path holds at most 107", "choose a shorter path"}},
      {conf(pool, dom, "", sock + "[metrics]\nlisten = \"localhost:http\"\n"),
       {"key 'metrics.listen': 'localhost:http' is not HOST:PORT", "e.g. \"127.0.0.1:9464\"",
        "\"\" turns the endpoint off"}},
      {conf(pool, dom, "", sock + "[metrics]\nlisten = \"127.0.0.1:99999\"\n"),
       {"key 'metrics.listen': '127.0.0.1:99999'", "port of 0..65535"}},
      {conf(pool, dom, "", sock + "tcp = \"localhost:http\"\n"),
       {"key 'rpc.tcp': 'localhost:http' is not HOST:PORT", "e.g. \"0.0.0.0:7443\""}},
      // A share for a host id that can never join.
      {conf(pool, dom, "", sock + "[capacity.shares]\n9 = 0.5\n"),
       {"key 'capacity.shares.9': host id 9 can never join this domain (not below "
        "domain.max_hosts 8)",
        "fix the id, or drop the share"}},
      {conf(pool, dom, "", sock + "[hosts]\nallowed = [1, 2]\n[capacity.shares]\n3 = 0.5\n"),
       {"key 'capacity.shares.3'", "not in hosts.allowed", "drop the share"}},
  };
  for (const Case& c : cases) {
    auto got = ParseConfig(c.text, "t.toml");
    ASSERT_FALSE(got.ok()) << "accepted:\n" << c.text;
    EXPECT_TRUE(absl::IsInvalidArgument(got.status())) << got.status();
    for (const std::string& w : c.want) {
      EXPECT_NE(got.status().message().find(w), std::string::npos)
          << "got: " << got.status().message() << "\nwant: " << w;
    }
  }
  // The same checks pass what is right: windows apart, the forms of HOST:PORT.
  const std::string ok[] = {
      conf("pool = \"devdax:/dev/dax0.0?offset=0&length=1G\"\n",
           "prefix_domain = \"devdax:/dev/dax0.0?offset=1G&length=64M\"\n"),
      conf(pool, "prefix_domain = \"file:/dev/shm/d?size=16M\"\n"),
      conf(pool, dom, "", sock + "[metrics]\nlisten = \"9464\"\n"),
      conf(pool, dom, "", sock + "[metrics]\nlisten = \"[::1]:9464\"\n"),
      conf(pool, dom, "", sock + "[capacity.shares]\n7 = 0.5\n"),
  };
  for (const std::string& text : ok) {
    auto got = ParseConfig(text, "t.toml");
    EXPECT_TRUE(got.ok()) << got.status() << "\n" << text;
  }
}

// The file-system half of the table: what LoadConfig and CheckConfigOnHost (--validate and the
// start) see on this host, and the state file's corrupt forms.
TEST(Config, BadFilesNameTheObjectAndTheFix) {
  const cxlkv::testing::TempDir scratch("badfiles", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  // A config path that is a directory: said so, not "key 'domain.pool' is required".
  auto loaded = LoadConfig(dir);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.status().message().find("config '" + dir + "' is a directory"),
            std::string::npos)
      << loaded.status();
  EXPECT_NE(loaded.status().message().find("pass --config with the domain's TOML file"),
            std::string::npos)
      << loaded.status();
  // A state file that is a directory.
  auto c = ParseConfig(kMinimal, "t.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  c->state_file = dir;
  absl::Status st = CheckConfigOnHost(*c);
  EXPECT_NE(st.message().find("domain.state_file " + dir + " is a directory"), std::string::npos)
      << st;
  EXPECT_NE(st.message().find("name a file (e.g. " + dir + "/domain.state)"), std::string::npos)
      << st;
  // A pool whose size= changed: the fix keeps the file (it holds every host's extents).
  const std::string pool_file = dir + "/pool";
  { std::ofstream(pool_file) << std::string(8192, 'x'); }
  c->state_file = dir + "/d.state";
  c->pool = "file:" + pool_file + "?size=16K";
  st = CheckConfigOnHost(*c);
  EXPECT_NE(
      st.message().find("domain.pool 'file:" + pool_file + "?size=16K': the file is 8192 bytes"),
      std::string::npos)
      << st;
  EXPECT_NE(st.message().find("set size= back to 8 KiB"), std::string::npos) << st;
  EXPECT_EQ(st.message().find("remove the file"), std::string::npos) << st;
  EXPECT_EQ(std::filesystem::file_size(pool_file), 8192u) << "nothing changed";
  c->pool = "file:" + pool_file + "?size=8K";
  EXPECT_TRUE(CheckConfigOnHost(*c).ok()) << CheckConfigOnHost(*c);
  // The state file empty, or corrupt: each names the file and says to restore it.
  c->pool = "file:/dev/shm/p?size=1G";
  const std::string state_file = dir + "/d.state";
  for (const std::string& text : {std::string(), std::string("{\"version\": 1}\n")}) {
    { std::ofstream(state_file) << text; }
    DomainState s(*c, 1ull << 30);
    st = s.Load(0);
    EXPECT_TRUE(absl::IsDataLoss(st)) << st;
    EXPECT_NE(st.message().find(state_file), std::string::npos) << st;
    EXPECT_NE(st.message().find(text.empty() ? "is empty" : "the state file is corrupt"),
              std::string::npos)
        << st;
    EXPECT_NE(st.message().find("restore the file from a backup"), std::string::npos) << st;
  }
}

Config TestConfig(const std::string& state_file) {
  auto c = ParseConfig(kMinimal, "t.toml");
  EXPECT_TRUE(c.ok());
  c->state_file = state_file;
  c->shares[1] = 0.25;
  return *c;
}

TEST(DomainState, JoinGrowHeartbeatFenceExpire) {
  const Config c = TestConfig("/tmp/unused.state");
  DomainState s(c, 1ull << 30);  // 16 extents of 64 MiB
  ASSERT_EQ(s.extents().size(), 16u);
  auto inc = s.Join(0, "a", 0);
  ASSERT_TRUE(inc.ok());
  EXPECT_EQ(*inc, 1u);
  EXPECT_TRUE(absl::IsPermissionDenied(s.Join(9, "x", 0).status()));
  auto g = s.Grow(0, 1, 20, 0);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->size(), 16u) << "share 1.0, capped by the pool";
  EXPECT_TRUE(absl::IsResourceExhausted(s.Grow(0, 1, 1, 0).status()));
  ASSERT_TRUE(s.Shrink(0, 1, {0, 1, 2, 3, 4, 5, 6, 7}, 0).ok());
  for (std::uint32_t i = 0; i < 8; ++i) {
    EXPECT_TRUE(s.extents()[i].quarantined) << "given back: quarantined, not free";
    s.ReleaseQuarantine(i);  // what the orchestrator does once no entry names its arena
  }
  ASSERT_TRUE(s.Join(1, "b", 0).ok());
  auto g1 = s.Grow(1, 1, 10, 0);
  ASSERT_TRUE(g1.ok());
  EXPECT_EQ(g1->size(), 4u) << "host 1's share is a quarter of 16";
  EXPECT_TRUE(absl::IsInvalidArgument(s.Shrink(1, 1, {15}, 0))) << "not its extent";
  EXPECT_TRUE(absl::IsFailedPrecondition(s.Heartbeat(1, 7, 0, 10))) << "stale incarnation";
  // Host 0 beats; host 1 goes silent: fenced after host_ttl, extents freed after the lease.
  for (std::int64_t t = 500; t <= 2500; t += 500) {
    ASSERT_TRUE(s.Heartbeat(0, 1, 123, t).ok());
    s.Expire(t);
  }
  EXPECT_EQ(s.hosts()[1].state, HostState::kFenced);
  EXPECT_EQ(s.ExtentsOf(1), 4u) << "the capacity lease outlives fencing";
  EXPECT_TRUE(absl::IsFailedPrecondition(s.Heartbeat(1, 1, 0, 2600))) << "fenced: rejoin";
  EXPECT_TRUE(absl::IsFailedPrecondition(s.Leave(1, 7, 2600))) << "not its incarnation";
  EXPECT_TRUE(s.Expire(10001));
  EXPECT_EQ(s.ExtentsOf(1), 0u);
  for (std::uint32_t i = 0; i < 16; ++i) {
    if (s.extents()[i].quarantined) s.ReleaseQuarantine(i);
  }
  EXPECT_EQ(s.ExtentsOf(0), 8u) << "host 0's last beat (2500) renewed its lease to 12500";
  EXPECT_TRUE(s.Expire(12501));
  EXPECT_EQ(s.ExtentsOf(0), 0u);
  // Rejoin: a new incarnation with nothing.
  auto inc2 = s.Join(1, "b", 11000);
  ASSERT_TRUE(inc2.ok());
  EXPECT_EQ(*inc2, 2u);
  ASSERT_TRUE(s.Drain(1).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(s.Grow(1, 2, 1, 11000).status())) << "draining";
}

// A drain is the operator's: it stands while the host is fenced (a busy or stopped machine
// misses host_ttl_ms), across the rejoin that follows and a restart of the orchestrator, until
// the host leaves. Before, a fence and a rejoin made a drained host live again and let it grow.
TEST(DomainState, ADrainStandsAcrossAFenceARejoinAndARestartUntilTheHostLeaves) {
  const cxlkv::testing::TempDir scratch("state", "/tmp");
  ASSERT_FALSE(scratch.path().empty());
  const Config c = TestConfig(scratch.path() + "/d.state");
  DomainState s(c, 1ull << 30);
  ASSERT_TRUE(s.Join(3, "node-a pid 7", 0).ok());
  ASSERT_TRUE(s.Grow(3, 1, 2, 0).ok());
  ASSERT_TRUE(s.Drain(3).ok());
  EXPECT_TRUE(s.Drain(3).ok()) << "draining twice is no error";
  EXPECT_EQ(s.hosts()[3].state, HostState::kDraining);
  // The machine stalls past host_ttl_ms: fenced, the drain still stands.
  EXPECT_TRUE(s.Expire(c.host_ttl_ms + 1));
  EXPECT_EQ(s.hosts()[3].state, HostState::kFenced);
  EXPECT_TRUE(s.hosts()[3].drain);
  // The same process rejoins (its heartbeat reply said fenced): draining, not live.
  auto inc = s.Join(3, "node-a pid 7", c.host_ttl_ms + 50);
  ASSERT_TRUE(inc.ok()) << inc.status();
  EXPECT_EQ(s.hosts()[3].state, HostState::kDraining);
  EXPECT_TRUE(absl::IsFailedPrecondition(s.Grow(3, *inc, 1, c.host_ttl_ms + 60).status()))
      << "a drained host does not grow again after a rejoin";
  // While it is draining and beating, another machine cannot take its id.
  ASSERT_TRUE(s.Heartbeat(3, *inc, 0, c.host_ttl_ms + 100).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(s.Join(3, "node-b pid 9", c.host_ttl_ms + 200).status()));
  // An operator may drain a fenced host: it comes back draining.
  ASSERT_TRUE(s.Join(4, "node-c pid 1", 0).ok());
  EXPECT_TRUE(s.Expire(2 * c.host_ttl_ms + 200));
  ASSERT_EQ(s.hosts()[4].state, HostState::kFenced);
  ASSERT_TRUE(s.Drain(4).ok());
  // An orchestrator restart keeps both drains (one draining, one fenced with its drain).
  ASSERT_TRUE(s.Save().ok());
  DomainState r(c, 1ull << 30);
  ASSERT_TRUE(r.Load(5000).ok());
  EXPECT_EQ(r.hosts()[3].state, HostState::kFenced) << "fenced in s before the save";
  EXPECT_TRUE(r.hosts()[3].drain);
  EXPECT_TRUE(r.hosts()[4].drain);
  auto inc4 = r.Join(4, "node-c pid 1", 5000);
  ASSERT_TRUE(inc4.ok());
  EXPECT_EQ(r.hosts()[4].state, HostState::kDraining);
  // Leaving ends the drain: the next process on that id is live and may grow.
  ASSERT_TRUE(r.Leave(4, *inc4, 5100).ok());
  EXPECT_FALSE(r.hosts()[4].drain);
  auto again = r.Join(4, "node-c pid 2", 5200);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(r.hosts()[4].state, HostState::kLive);
  EXPECT_TRUE(r.Grow(4, *again, 1, 5200).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(r.Drain(9))) << "an id never seen is not drained";
}

// Two machines configured with the same host id (SGLang ranks of two engines given one
// host_id): the second join is refused while the first is live, naming both machines; a
// restart on the same machine, and a join after the holder's heartbeat is older than
// host_ttl_ms, take the row over.
TEST(DomainState, ASecondMachineCannotTakeALiveHostId) {
  const Config c = TestConfig("/tmp/unused.state");
  DomainState s(c, 1ull << 30);
  ASSERT_TRUE(s.Join(3, "node-a pid 100", 0).ok());
  auto dup = s.Join(3, "node-b pid 200", 500);
  ASSERT_TRUE(absl::IsAlreadyExists(dup.status())) << dup.status();
  const std::string m(dup.status().message());
  EXPECT_NE(m.find("host id 3 is live on machine 'node-a'"), std::string::npos) << m;
  EXPECT_NE(m.find("machine 'node-b'"), std::string::npos) << m;
  EXPECT_NE(m.find("host_id range"), std::string::npos) << m;
  EXPECT_EQ(s.hosts()[3].incarnation, 1u) << "the live holder keeps its row";
  // The holder keeps beating; a restart on its own machine takes the row over.
  ASSERT_TRUE(s.Heartbeat(3, 1, 0, 1000).ok());
  auto restarted = s.Join(3, "node-a pid 101", 1200);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_EQ(*restarted, 2u);
  // node-a goes silent: once its heartbeat is older than host_ttl_ms, node-b may join.
  EXPECT_TRUE(absl::IsAlreadyExists(s.Join(3, "node-b pid 200", 1200 + 2000).status()));
  auto taken = s.Join(3, "node-b pid 200", 1200 + 2001);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(*taken, 3u);
}

// Extents a host loses go into quarantine, never straight back to the free pool: a new
// incarnation's old extents until the old lease term ends (a zombie may still write), expired
// ones at once; Grow skips them; the quarantine and the arena found survive a restart.
TEST(DomainState, LostExtentsAreQuarantinedAndSurviveARestart) {
  const cxlkv::testing::TempDir scratch("state", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const Config c = TestConfig(std::string(tmpl) + "/d.state");
  DomainState s(c, 1ull << 30);  // 16 extents
  ASSERT_TRUE(s.Join(0, "a", 0).ok());
  ASSERT_EQ(s.Grow(0, 1, 16, 0)->size(), 16u);
  ASSERT_TRUE(s.Join(0, "a pid 2", 100).ok());  // restarted on its machine: incarnation 2
  std::uint32_t q = 0;
  for (const ExtentInfo& e : s.extents()) {
    q += e.quarantined;
    EXPECT_EQ(e.former_host, 0u);
    EXPECT_EQ(e.expires_ms, 10000) << "reusable only after the old lease term";
    EXPECT_STREQ(e.state_name(), "quarantined");
  }
  EXPECT_EQ(q, 16u);
  EXPECT_EQ(s.ExtentsOf(0), 0u);
  auto none = s.Grow(0, 2, 1, 200);
  EXPECT_TRUE(absl::IsResourceExhausted(none.status()));
  EXPECT_NE(std::string(none.status().message()).find("16 quarantined"), std::string::npos)
      << none.status();
  s.SetQuarantineArena(3, "00112233445566778899aabbccddeeff");
  s.SetQuarantineArena(4, "");
  ASSERT_TRUE(s.Save().ok());
  DomainState r(c, 1ull << 30);
  ASSERT_TRUE(r.Load(5000).ok());
  EXPECT_TRUE(r.extents()[3].quarantined);
  EXPECT_EQ(r.extents()[3].arena, "00112233445566778899aabbccddeeff");
  EXPECT_TRUE(r.extents()[4].arena_checked);
  EXPECT_FALSE(r.extents()[5].arena_checked);
  EXPECT_EQ(r.extents()[3].expires_ms, 5000 + c.capacity_lease_ms) << "a full term again";
  EXPECT_EQ(r.recovered_extents(), 0u);
  r.ReleaseQuarantine(3);
  EXPECT_TRUE(r.extents()[3].free());
  ASSERT_EQ(r.Grow(0, 2, 4, 5000)->size(), 1u) << "only the released one is lent";
}

TEST(DomainState, SavedStateSurvivesAndCorruptionIsReported) {
  const cxlkv::testing::TempDir scratch("state", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string file = std::string(tmpl) + "/d.state";
  const Config c = TestConfig(file);
  {
    DomainState s(c, 1ull << 30);
    const absl::Status none = s.Load(0);
    EXPECT_TRUE(absl::IsNotFound(none)) << "no file: the caller decides (--new-domain)";
    EXPECT_NE(none.message().find(file), std::string::npos) << none;
    ASSERT_TRUE(s.Join(2, "c", 0).ok());
    ASSERT_TRUE(s.Grow(2, 1, 3, 0).ok());
    ASSERT_TRUE(s.Save().ok());
  }
  DomainState r(c, 1ull << 30);
  ASSERT_TRUE(r.Load(50000).ok());
  EXPECT_EQ(r.recovered_extents(), 3u);
  EXPECT_EQ(r.ExtentsOf(2), 3u);
  EXPECT_EQ(r.hosts()[2].incarnation, 1u);
  EXPECT_TRUE(r.Heartbeat(2, 1, 0, 50001).ok()) << "the host keeps its incarnation";
  EXPECT_FALSE(r.Expire(50000 + 1999)) << "timers restarted at load";
  // Another pool size: refused, not silently reset.
  DomainState other(c, 2ull << 30);
  EXPECT_TRUE(absl::IsDataLoss(other.Load(0)));
  // A flipped byte: refused.
  std::string text = r.Serialize();
  text[5] ^= 1;
  { std::ofstream(file) << text; }
  DomainState torn(c, 1ull << 30);
  const absl::Status st = torn.Load(0);
  EXPECT_TRUE(absl::IsDataLoss(st));
  EXPECT_NE(st.message().find("checksum"), std::string::npos) << st;
}

// Audit #3 (server half): a host that leaves (the preload's exit path) may still write its
// extents until their lease term ends (static destructors, other threads until exit_group):
// Leave quarantines them until then, as docs/preload.md ("Exit") says, and nobody else is
// lent them before.
TEST(DomainState, LeaveQuarantinesExtentsUntilTheirLeaseTermEnds) {
  const Config c = TestConfig("/tmp/unused.state");
  DomainState s(c, 64ull << 20);  // one extent
  ASSERT_TRUE(s.Join(0, "a", 0).ok());
  ASSERT_EQ(s.Grow(0, 1, 1, 0)->size(), 1u);
  ASSERT_TRUE(s.Heartbeat(0, 1, 0, 1000).ok());  // the lease now ends at 1000 + 10000
  ASSERT_TRUE(s.Leave(0, 1, 2000).ok());
  const ExtentInfo& e = s.extents()[0];
  EXPECT_TRUE(e.quarantined);
  EXPECT_EQ(e.former_host, 0u);
  EXPECT_EQ(e.expires_ms, 1000 + c.capacity_lease_ms)
      << "a left host's extent is reusable before its lease term ends";
  s.Expire(5000);
  EXPECT_TRUE(s.extents()[0].quarantined);
  ASSERT_TRUE(s.Join(1, "b", 5000).ok());
  const auto none = s.Grow(1, 1, 1, 5000);
  EXPECT_TRUE(absl::IsResourceExhausted(none.status())) << none.status();
}

#if defined(__x86_64__)
// Runs Save() in a child process under a seccomp filter that fails syscall `nr` with `err`
// (with flags_arg >= 0: only calls whose argument flags_arg has O_DIRECTORY); returns the
// status's text, "OK", or "skip: ..." when seccomp is not available.
std::string SaveUnderFilter(const DomainState& s, int nr, int flags_arg, int err) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t p = ::fork();
  if (p == 0) {
    const std::uint32_t fail = SECCOMP_RET_ERRNO | static_cast<std::uint32_t>(err);
    std::vector<sock_filter> prog = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<std::uint32_t>(nr), 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    if (flags_arg >= 0) {  // only calls with O_DIRECTORY in that argument (its low word)
      prog.push_back(
          BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                   static_cast<std::uint32_t>(offsetof(seccomp_data, args) + 8 * flags_arg)));
      prog.push_back(BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, O_DIRECTORY, 1, 0));
      prog.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    }
    prog.push_back(BPF_STMT(BPF_RET | BPF_K, fail));
    sock_fprog fp{static_cast<unsigned short>(prog.size()), prog.data()};
    std::string out = "OK";
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fp) != 0) {
      out = std::string("skip: seccomp: ") + std::strerror(errno);
    } else if (const absl::Status st = s.Save(); !st.ok()) {
      out = st.ToString();
    }
    (void)!::write(fds[1], out.data(), out.size());
    _exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;)
    out.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  ::waitpid(p, nullptr, 0);
  return out;
}
#endif

// The state file's rename is durable only once its directory is synced: a directory that
// cannot be opened or synced fails Save, naming the directory, instead of passing silently.
TEST(DomainState, SaveReportsAFailingDirectorySync) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "the seccomp filter here is written for x86-64";
#else
  const cxlkv::testing::TempDir scratch("state", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const Config c = TestConfig(std::string(tmpl) + "/d.state");
  DomainState s(c, 1ull << 30);
  ASSERT_TRUE(s.Join(0, "a", 0).ok());
  ASSERT_EQ(SaveUnderFilter(s, -1, -1, 0), "OK") << "no filter";
  // openat(..., O_DIRECTORY) fails: only the directory's open.
  const std::string no_open = SaveUnderFilter(s, SYS_openat, 2, EACCES);
  if (no_open.rfind("skip:", 0) == 0) GTEST_SKIP() << no_open;
  EXPECT_NE(no_open.find("directory " + std::string(tmpl)), std::string::npos)
      << "Save with a directory it cannot open to sync: " << no_open;
  // fsync fails (the file itself is synced with fdatasync).
  const std::string no_sync = SaveUnderFilter(s, SYS_fsync, -1, EIO);
  EXPECT_NE(no_sync.find("directory " + std::string(tmpl)), std::string::npos)
      << "Save with a failing directory fsync: " << no_sync;
  EXPECT_NE(no_sync.find("Input/output error"), std::string::npos) << no_sync;
#endif
}

// [etcd] (orchestrator HA, docs/ha.md): defaults follow from the other keys; every mistake
// names the key.
TEST(Config, EtcdSection) {
  auto none = ParseConfig(kMinimal, "t.toml");
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->etcd.enabled());
  auto c =
      ParseConfig(WithExtra("[etcd]\nendpoints = [\"127.0.0.1:2379\", \"e2:2379\"]\n"), "t.toml");
  ASSERT_FALSE(c.ok()) << "no domain name for the keys";
  EXPECT_NE(c.status().message().find("domain.name or etcd.domain"), std::string::npos)
      << c.status();
  c = ParseConfig(WithExtra("[etcd]\nendpoints = [\"127.0.0.1:2379\", \"e2:2379\"]\n"
                            "domain = \"rack7\"\nttl_s = 4\n"),
                  "t.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->etcd.enabled());
  EXPECT_EQ(c->etcd.endpoints.size(), 2u);
  EXPECT_EQ(c->etcd.domain, "rack7");
  EXPECT_EQ(c->etcd.cluster, "default");
  EXPECT_EQ(c->etcd.ttl_s, 4u);
  EXPECT_EQ(c->etcd.margin_ms, 1000u);  // ttl / 4
  struct Case {
    std::string extra, want;
  } cases[] = {
      {"[etcd]\nendpoints = [\"nohost\"]\ndomain = \"d\"\n", "is not host:port"},
      {"[etcd]\nendpoints = [\"h:x\"]\ndomain = \"d\"\n", "is not host:port"},
      {"[etcd]\nendpoints = \"h:1\"\n", "expected an array"},
      {"[etcd]\nendpoints = [\"h:1\"]\ndomain = \"a/b\"\n", "no '/' or spaces"},
      {"[etcd]\nendpoints = [\"h:1\"]\ndomain = \"d\"\nttl_s = 1\n", "key 'etcd.ttl_s'"},
      {"[etcd]\nendpoints = [\"h:1\"]\ndomain = \"d\"\nttl_s = 3\nmargin_ms = 2000\n",
       "key 'etcd.margin_ms'"},
      {"[etcd]\nttl_s = 5\n", "has no endpoints"},
      {"[etcd]\nendpoint = [\"h:1\"]\n", "key 'etcd.endpoint': unknown key"},
      {"[etcd]\nendpoints = [\"h:1\"]\ndomain = \"d\"\nuser = \"root\"\n",
       "'etcd.user' and 'etcd.password_file' go together"},
      {"[etcd]\nendpoints = [\"h:1\"]\ndomain = \"d\"\nuser = \"root\"\n"
       "password_file = \"/nonexistent/pw\"\n",
       "etcd.password_file '/nonexistent/pw'"},
      {"[etcd]\nendpoints = [\"h:1\"]\ndomain = \"d\"\ncert = \"/c.pem\"\nkey = \"/k.pem\"\n",
       "need 'etcd.ca'"},
      {"[etcd]\nendpoints = [\"h:1\"]\ndomain = \"d\"\nca = \"/ca.pem\"\ncert = \"/c.pem\"\n",
       "'etcd.cert' and 'etcd.key' go together"},
      {"[etcd]\nuser = \"root\"\n", "has no endpoints"},
  };
  for (const Case& k : cases) {
    auto bad = ParseConfig(WithExtra(k.extra), "t.toml");
    ASSERT_FALSE(bad.ok()) << k.extra;
    EXPECT_NE(bad.status().message().find(k.want), std::string::npos)
        << k.extra << " -> " << bad.status();
  }
}

}  // namespace
}  // namespace cxlkv::orchestrator
