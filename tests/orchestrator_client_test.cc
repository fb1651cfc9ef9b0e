// The orchestrator in this process, on a clock the test moves, with HostClients whose clocks
// the test moves too: capacity-lease validity on the host (per extent, across a Grow, a
// frozen or suspended clock), heartbeat replies racing a Grow, the give-back of a revoked
// extent, opening a domain whose state file is missing, and refusing disallowed peers at
// accept. Label rpc (gRPC in-process; Debian's gRPC is not TSan-instrumented).
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

#include "cxlkv/coherence/domain_layout.h"
#include "cxlkv/coherence/mem.h"
#include "cxlkv/orchestrator/client.h"
#include "cxlkv/orchestrator/config.h"
#include "cxlkv/orchestrator/daemon.h"
#include "cxlkv/orchestrator/pooled_arenas.h"
#include "cxlkv/pool/region.h"
#include "cxlkv/pool/spec.h"
#include "gtest/gtest.h"

namespace cxlkv::orchestrator {
namespace {

namespace co = ::cxlkv::coherence;

// Polls cond for up to 5 s of real time (the owner loop acts on the manual clock every 5 ms).
bool WaitFor(const std::function<bool()>& cond) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return cond();
}

constexpr std::int64_t kT0 = 1'000'000;  // where every clock starts
constexpr std::int64_t kLease = 10'000;  // capacity_lease_ms below

// The orchestrator's clock: stands still until the test moves it.
class ManualClock final : public co::Clock {
 public:
  std::int64_t NowMs() override { return now_.load(); }
  void Set(std::int64_t t) { now_.store(t); }

 private:
  std::atomic<std::int64_t> now_{kT0};
};

// A host's three clocks, moved by the test: together (time passes), or the monotonic and
// boot clocks held (a VM stop), or only the monotonic one (a suspend).
struct HostClocks {
  std::atomic<std::int64_t> mono{kT0}, boot{kT0}, real{kT0};
  void Set(std::int64_t t) {
    mono = t;
    boot = t;
    real = t;
  }
  HostClientOptions Options() {
    HostClientOptions o;
    o.clock = [this] { return HostClockReading{mono.load(), boot.load(), real.load()}; };
    return o;
  }
};

class InProcessDomain {
 public:
  // pool_query: the pool's spec after "file:<dir>/pool?".
  explicit InProcessDomain(const std::string& host_ttl_ms = "2000",
                           const std::string& pool_query = "size=64M") {
    char tmpl[] = "/tmp/cxlkv-inproc-XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl), nullptr);
    dir = tmpl;
    auto c = ParseConfig(
        "[domain]\nname = \"inproc\"\n"
        "pool = \"file:" +
            dir + "/pool?" + pool_query +
            "\"\n"
            "prefix_domain = \"file:" +
            dir +
            "/domain?size=4M\"\n"
            "extent_size = \"16M\"\nstate_file = \"" +
            dir +
            "/d.state\"\n"
            "index_entries = 1024\nmax_hosts = 4\n"
            "[rpc]\nsocket = \"" +
            dir +
            "/o.sock\"\n[metrics]\nlisten = \"\"\n"
            "[timing]\nlease_ttl_ms = 2000\nheartbeat_period_ms = 250\n"
            "grace_ms = 20\nhost_ttl_ms = " +
            host_ttl_ms +
            "\n"
            "capacity_lease_ms = " +
            std::to_string(kLease) + "\n",
        "inproc.toml");
    EXPECT_TRUE(c.ok()) << c.status();
    config = *c;
  }
  ~InProcessDomain() {
    if (orch) orch->Stop();
    orch.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

  // new_domain: the first start (--new-domain).
  absl::Status Open(bool new_domain = true) {
    OpenOptions o;
    o.new_domain = new_domain;
    o.clock = &clock;
    auto opened = Orchestrator::Open(config, o);
    if (!opened.ok()) return opened.status();
    orch = *std::move(opened);
    return orch->Start();
  }
  absl::StatusOr<std::unique_ptr<HostClient>> Connect(std::uint32_t host, HostClocks& clocks) {
    return HostClient::Connect(config.socket, host, clocks.Options());
  }
  std::string ExtentState(std::uint32_t i) { return orch->status().extents[i].state_name(); }
  bool Assigned(std::uint32_t i, std::uint32_t host) {
    return orch->status().extents[i].host == host;
  }

  std::string dir;
  Config config;
  ManualClock clock;
  std::unique_ptr<Orchestrator> orch;
};

// The extent a one-extent Grow got.
std::uint32_t GrowOne(HostClient& c) {
  auto got = c.Grow(1);
  EXPECT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got.ok() ? got->size() : 0u, 1u);
  return got.ok() && !got->empty() ? got->front().index : ~0u;
}

// Audit #10: a formatted prefix domain with no state file is a domain whose extent
// assignments were lost (a mis-pathed or deleted state file), not a new one: opening it must
// fail, naming the file and the fix, instead of lending extents that live hosts still write.
TEST(OrchestratorOpen, AFormattedDomainWithoutItsStateFileIsDataLoss) {
  InProcessDomain d;
  {
    // What an earlier run of the orchestrator left: a formatted prefix domain.
    auto dom = pool::OpenRegion(d.config.prefix_domain);
    ASSERT_TRUE(dom.ok()) << dom.status();
    co::DirectMem mem((*dom)->addr(), (*dom)->size_bytes());
    co::DomainGeometry g;
    g.max_hosts = d.config.max_hosts;
    g.index_entries = d.config.index_entries;
    g.lease_rows = d.config.lease_rows;
    g.ring_slots = d.config.ring_slots;
    g.lease_ttl_ms = d.config.lease_ttl_ms;
    g.host_ttl_ms = d.config.host_ttl_ms;
    g.grace_ms = d.config.grace_ms;
    ASSERT_TRUE(co::FormatDomain(mem, g).ok());
  }
  const absl::Status st = d.Open(/*new_domain=*/false);
  ASSERT_FALSE(st.ok()) << "opened a formatted domain without its state file as a new domain";
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_NE(st.message().find(d.config.state_file), std::string::npos) << st;
  EXPECT_NE(st.message().find("--new-domain"), std::string::npos) << st;
  // The operator's way out: a new domain on it, every extent quarantined for a full lease.
  ASSERT_TRUE(d.Open(/*new_domain=*/true).ok());
  for (std::uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(d.ExtentState(i), "quarantined") << "extent " << i;
  }
  HostClocks clocks;
  auto c = d.Connect(0, clocks);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(absl::IsResourceExhausted((*c)->Grow(1).status()));
  d.clock.Set(kT0 + kLease);  // a full lease later (host 0 is fenced meanwhile: it rejoins)
  ASSERT_TRUE(WaitFor([&] { return d.ExtentState(3) == "free"; })) << "no arena in it";
  ASSERT_TRUE((*c)->HeartbeatOnce().ok());
  EXPECT_EQ(GrowOne(**c), 0u);
}

// --new-domain creates the state file at once; later starts read it and need no flag, and
// the flag is refused once the file exists. Without both flag and file, nothing starts.
TEST(OrchestratorOpen, ANewDomainIsCreatedOnlyWhenAskedFor) {
  InProcessDomain d;
  const absl::Status not_asked = d.Open(/*new_domain=*/false);
  EXPECT_TRUE(absl::IsFailedPrecondition(not_asked)) << not_asked;
  EXPECT_NE(not_asked.message().find("--new-domain"), std::string::npos) << not_asked;
  {
    auto dom = pool::OpenRegion(d.config.prefix_domain);
    ASSERT_TRUE(dom.ok()) << dom.status();
    co::DirectMem mem((*dom)->addr(), (*dom)->size_bytes());
    EXPECT_TRUE(absl::IsNotFound(co::ReadDomainHeader(mem).status())) << "refused, yet formatted";
  }
  ASSERT_TRUE(d.Open(/*new_domain=*/true).ok());
  EXPECT_TRUE(std::filesystem::exists(d.config.state_file)) << "written at the first start";
  for (std::uint32_t i = 0; i < 4; ++i) EXPECT_EQ(d.ExtentState(i), "free");
  HostClocks clocks;
  auto c = d.Connect(0, clocks);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::uint32_t a = GrowOne(**c);
  d.orch->Stop();  // as if killed: the host is still there
  d.orch.reset();
  const absl::Status again = d.Open(/*new_domain=*/true);
  EXPECT_TRUE(absl::IsFailedPrecondition(again)) << again;
  EXPECT_NE(again.message().find(d.config.state_file), std::string::npos) << again;
  ASSERT_TRUE(d.Open(/*new_domain=*/false).ok());
  EXPECT_TRUE(d.Assigned(a, 0)) << "the assignment survived the restart";
}

// Audit #11: a Grow reply renews only the extents it grants (the orchestrator renews only
// those); the extents held before keep their own deadline. host_ttl = capacity lease, the
// configuration the audit names: no heartbeat for half a lease, then a Grow.
TEST(HostClient, AGrowDoesNotRenewTheExtentsHeldBefore) {
  InProcessDomain d(std::to_string(kLease));
  ASSERT_TRUE(d.Open().ok());
  HostClocks clocks;
  auto c = d.Connect(0, clocks);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::uint32_t a = GrowOne(**c);  // the orchestrator's lease on it ends at kT0 + kLease
  d.clock.Set(kT0 + kLease / 2);
  clocks.Set(kT0 + kLease / 2);
  const std::uint32_t b = GrowOne(**c);
  EXPECT_TRUE((*c)->ExtentsValid());
  // Past a's lease on both clocks: the orchestrator takes a back.
  d.clock.Set(kT0 + kLease + 1);
  clocks.Set(kT0 + kLease + 1);
  ASSERT_TRUE(WaitFor([&] { return !d.Assigned(a, 0); })) << "the orchestrator kept extent " << a;
  EXPECT_TRUE(d.Assigned(b, 0));
  EXPECT_FALSE((*c)->ExtentsValid())
      << "the host still counts extent " << a << " valid, which the orchestrator took back at "
      << kT0 + kLease << ": the Grow of extent " << b << " at " << kT0 + kLease / 2
      << " extended it";
  EXPECT_FALSE((*c)->ExtentValid(a));
  EXPECT_TRUE((*c)->ExtentValid(b)) << "granted at half the lease: valid until ¾ lease later";
}

// Audit #14: a heartbeat reply computed before a concurrent Grow was granted must not drop
// the granted extent (the watchdog would revoke a fresh arena, and the extent would stay
// lent to this host unused).
TEST(HostClient, AHeartbeatReplyOlderThanAGrowKeepsTheGrant) {
  InProcessDomain d;
  ASSERT_TRUE(d.Open().ok());
  HostClocks clocks;
  std::function<void()> between;
  HostClientOptions o = clocks.Options();
  o.before_heartbeat_applied = [&] {
    if (!between) return;
    auto run = std::move(between);
    between = nullptr;
    run();
  };
  auto c = HostClient::Connect(d.config.socket, 0, o);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::uint32_t a = GrowOne(**c);
  std::uint32_t b = ~0u;
  // The heartbeat's reply is on its way (it lists a only); the Grow of b completes first.
  between = [&] { b = GrowOne(**c); };
  ASSERT_TRUE((*c)->HeartbeatOnce().ok());
  ASSERT_NE(b, ~0u);
  EXPECT_TRUE(d.Assigned(b, 0));
  EXPECT_TRUE((*c)->Holds(a));
  EXPECT_TRUE((*c)->Holds(b)) << "the older heartbeat reply dropped extent " << b
                              << ", granted after it was computed";
  // The next heartbeat was sent after the grant: its reply lists both.
  ASSERT_TRUE((*c)->HeartbeatOnce().ok());
  EXPECT_TRUE((*c)->Holds(a));
  EXPECT_TRUE((*c)->Holds(b));
  EXPECT_EQ((*c)->extents().size(), 2u);
}

// Audit #14, second half: an extent the host revoked on its own (its lease lapsed on its
// clock, which runs ahead here) is still given back by Shrink; it was never the
// orchestrator's idea to take it, so only the give-back frees it.
TEST(PooledArenas, ARevokedExtentIsStillGivenBack) {
  InProcessDomain d;
  ASSERT_TRUE(d.Open().ok());
  HostClocks clocks;
  auto c = d.Connect(0, clocks);
  ASSERT_TRUE(c.ok()) << c.status();
  std::atomic<int> revoked{0};
  std::uint32_t extent = ~0u;
  {
    PooledArenas arenas(**c);
    auto raw = arenas.GrowRaw([&](std::uint32_t) { revoked.fetch_add(1); });
    ASSERT_TRUE(raw.ok()) << raw.status();
    extent = raw->extent;
    clocks.Set(kT0 + kLease);  // past ¾ of the lease on the host's clock only
    ASSERT_TRUE(WaitFor([&] { return revoked.load() == 1; })) << "the watchdog did not revoke";
    EXPECT_TRUE(d.Assigned(extent, 0)) << "the orchestrator's clock stands: still lent";
    ASSERT_TRUE(arenas.Shrink(extent).ok());
  }
  // Given back: quarantined, or already free (no arena in it names anything).
  EXPECT_NE(d.ExtentState(extent), "assigned")
      << "Shrink of a revoked extent did not give it back: the orchestrator still lends it to "
         "host 0 (renewed by every heartbeat, never used)";
}

// A pool that is itself a window of its source (offset=, length=): an extent's window is the
// pool's offset plus the extent's offset inside the pool, so the host maps the bytes the
// orchestrator lends. (It replaced the pool's offset with the extent's: host 0's arena landed
// at file offset 0, outside the pool, found by the two-host QEMU test's set-up.)
TEST(PooledArenas, AnExtentOfAWindowedPoolIsInsideThePool) {
  InProcessDomain d("2000", "size=96M&offset=32M&length=64M");
  ASSERT_TRUE(d.Open().ok());
  HostClocks clocks;
  auto c = d.Connect(0, clocks);
  ASSERT_TRUE(c.ok()) << c.status();
  PooledArenas arenas(**c);
  auto raw = arenas.GrowRaw([](std::uint32_t) {});
  ASSERT_TRUE(raw.ok()) << raw.status();
  auto spec = pool::ParseSourceSpec(raw->spec);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const std::uint64_t pool_offset = 32ull << 20, extent_bytes = 16ull << 20;
  EXPECT_EQ(spec->offset, pool_offset + raw->extent * extent_bytes) << raw->spec;
  EXPECT_EQ(spec->length, extent_bytes) << raw->spec;
  {
    // What the host writes through its window is what the pool holds at the extent's place.
    auto window = pool::OpenRegion(raw->spec);
    ASSERT_TRUE(window.ok()) << window.status();
    std::memset((*window)->addr(), 0xA5, 4096);
    auto whole = pool::OpenRegion("file:" + d.dir + "/pool");
    ASSERT_TRUE(whole.ok()) << whole.status();
    const std::byte* lent = (*whole)->addr() + pool_offset + raw->extent * extent_bytes;
    for (std::size_t i = 0; i < 4096; ++i) ASSERT_EQ(lent[i], std::byte{0xA5}) << "byte " << i;
    EXPECT_EQ((*whole)->addr()[0], std::byte{0}) << "the host wrote before the pool's window";
  }
  ASSERT_TRUE(arenas.Shrink(raw->extent).ok());
}

// This process's resident set in bytes (VmRSS of /proc/self/status).
std::uint64_t ResidentBytes() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  std::uint64_t kib = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "VmRSS: %lu kB", &kib) == 1) break;
  }
  std::fclose(f);
  return kib << 10;
}

// Busy hosts (issue #39): resolving the first block of another host's arena opened a view of
// its extent and invalidated the whole extent, which faulted in every page of it (a 1 GiB
// extent: seconds on a loaded host) while the caller held the leases it had just taken; they
// expired before the first copy. The view must read what opening the arena reads (header,
// owner table, map), not the extent: the resident set grows by that, not by the extent.
TEST(PooledArenas, ResolvingAPeerArenaReadsItsMetadataNotTheWholeExtent) {
  InProcessDomain d;
  ASSERT_TRUE(d.Open().ok());
  HostClocks clocks0, clocks1;
  auto c0 = d.Connect(0, clocks0);
  ASSERT_TRUE(c0.ok()) << c0.status();
  auto c1 = d.Connect(1, clocks1);
  ASSERT_TRUE(c1.ok()) << c1.status();
  PooledArenas publisher(**c0);
  pool::FormatOptions fo;
  auto layout = pool::ParseKvLayout("llama3-8b");
  ASSERT_TRUE(layout.ok()) << layout.status();
  fo.layout = *layout;
  auto grown = publisher.Grow(fo);
  ASSERT_TRUE(grown.ok()) << grown.status();
  const std::uint64_t extent_bytes = grown->arena->region().size_bytes();
  co::BlockRef ref{};
  std::memcpy(ref.arena, grown->arena->uuid().data(), 16);
  ref.index = 0;
  ref.generation = 0;
  PooledArenas reader(**c1);
  const std::uint64_t before = ResidentBytes();
  auto addr = reader.Resolve(ref);
  const std::uint64_t after = ResidentBytes();
  // Block 0 is free (never allocated): the view resolved it and found it stale.
  ASSERT_TRUE(addr.ok() || absl::IsFailedPrecondition(addr.status())) << addr.status();
  EXPECT_LT(after - std::min(after, before), extent_bytes / 4)
      << "opening a view of another host's " << (extent_bytes >> 20) << " MiB extent made "
      << ((after - std::min(after, before)) >> 10) << " KiB resident: it touched the whole extent";
  grown->arena.reset();
}

// Audit #6: a host whose clocks froze (a VM stop: CLOCK_MONOTONIC and CLOCK_BOOTTIME held)
// while the orchestrator took its extent back and lent it to another host must not count the
// extent valid when it resumes. Its wall clock, stepped forward on resume, gives the pause
// away; until a fresh heartbeat acknowledgement nothing is valid.
TEST(HostClient, AFrozenClockDoesNotKeepAnExtentValid) {
  InProcessDomain d;
  ASSERT_TRUE(d.Open().ok());
  HostClocks clocks, other_clocks;
  auto c = d.Connect(0, clocks);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::uint32_t a = GrowOne(**c);
  d.clock.Set(kT0 + 1000);
  clocks.Set(kT0 + 1000);
  ASSERT_TRUE((*c)->HeartbeatOnce().ok());
  EXPECT_TRUE((*c)->ExtentsValid());
  // Frozen: the orchestrator runs on past the lease, fences host 0, takes a back, lends it.
  d.clock.Set(kT0 + 1000 + kLease + 1);
  ASSERT_TRUE(WaitFor([&] { return d.ExtentState(a) == "free"; })) << d.ExtentState(a);
  other_clocks.Set(kT0 + 1000 + kLease + 1);
  auto other = d.Connect(1, other_clocks);
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE((*other)->Grow(4).ok());
  ASSERT_TRUE(d.Assigned(a, 1)) << "extent " << a << " was lent to host 1";
  // Resume: the monotonic and boot clocks go on from where they stopped; NTP steps the wall
  // clock to the real time.
  clocks.mono = kT0 + 1001;
  clocks.boot = kT0 + 1001;
  clocks.real = kT0 + 1000 + kLease + 2;
  EXPECT_FALSE((*c)->ExtentsValid())
      << "host 0 counts extent " << a << " valid after a pause in which it was lent to host 1";
  // The next acknowledgement: fenced, rejoined, nothing held.
  ASSERT_TRUE((*c)->HeartbeatOnce().ok());
  EXPECT_EQ((*c)->rejoins(), 1u);
  EXPECT_TRUE((*c)->extents().empty());
}

// The pause rule's other side: a wall-clock step below the margin (¼ lease) changes
// nothing, and after a larger one the extent is valid again once a heartbeat sent after it
// is acknowledged (the host was not fenced: host_ttl = lease here).
TEST(HostClient, APauseEndsWithAFreshAcknowledgement) {
  InProcessDomain d(std::to_string(kLease));
  ASSERT_TRUE(d.Open().ok());
  HostClocks clocks;
  auto c = d.Connect(0, clocks);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::uint32_t a = GrowOne(**c);
  clocks.real = kT0 + kLease / 4 - 100;  // NTP stepped the wall clock by less than the margin
  EXPECT_TRUE((*c)->ExtentValid(a));
  clocks.real = kT0 + kLease / 4 + 1000;  // more: held for a pause
  EXPECT_FALSE((*c)->ExtentValid(a));
  d.clock.Set(kT0 + kLease / 4 + 1000);
  ASSERT_TRUE((*c)->HeartbeatOnce().ok());
  EXPECT_EQ((*c)->rejoins(), 0u);
  EXPECT_TRUE((*c)->ExtentValid(a)) << "acknowledged after the step: valid again";
}

// Audit #6, suspend: CLOCK_MONOTONIC stops during a suspend, CLOCK_BOOTTIME does not; the
// host's deadline counts on the boot clock.
TEST(HostClient, ASuspendDoesNotKeepAnExtentValid) {
  InProcessDomain d;
  ASSERT_TRUE(d.Open().ok());
  HostClocks clocks;
  auto c = d.Connect(0, clocks);
  ASSERT_TRUE(c.ok()) << c.status();
  const std::uint32_t a = GrowOne(**c);
  d.clock.Set(kT0 + kLease + 1);
  ASSERT_TRUE(WaitFor([&] { return !d.Assigned(a, 0); }));
  clocks.boot = kT0 + kLease + 1;  // suspended: the monotonic clock stood still
  clocks.real = kT0 + kLease + 1;
  EXPECT_FALSE((*c)->ExtentsValid())
      << "a suspend stopped the monotonic clock, and the host counts extent " << a
      << " valid past the orchestrator's expiry";
}

// Audit #18: a peer whose uid is not allowed is refused at accept: its connection is closed
// before gRPC sees it (no HTTP/2 settings frame, no call), and the daemon keeps nothing of it.
TEST(OrchestratorAccept, ADisallowedUidIsRefusedAtAccept) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: a child connects as uid 65534 (setresuid)";
  InProcessDomain d;
  ASSERT_TRUE(d.Open().ok());
  ASSERT_EQ(::chmod(d.dir.c_str(), 0755), 0);  // uid 65534 must reach the socket
  auto count_fds = [] {
    int n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
    return n;
  };
  const int fds_before = count_fds();
  for (int i = 0; i < 64; ++i) {
    const pid_t p = ::fork();
    ASSERT_GE(p, 0);
    if (p == 0) {
      // Exit codes: 0 refused (EOF or reset), 1 the daemon spoke HTTP/2 to us, 2-5 setup.
      if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0) _exit(2);
      const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
      sockaddr_un a{};
      a.sun_family = AF_UNIX;
      std::strncpy(a.sun_path, d.config.socket.c_str(), sizeof(a.sun_path) - 1);
      if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) _exit(3);
      static const char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
      (void)::send(fd, kPreface, sizeof(kPreface) - 1, MSG_NOSIGNAL);
      pollfd pfd{fd, POLLIN, 0};
      if (::poll(&pfd, 1, 5000) != 1) _exit(4);
      char buf[64];
      const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
      _exit(n == 0 || (n < 0 && errno == ECONNRESET) ? 0 : n > 0 ? 1 : 5);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(p, &status, 0), p);
    ASSERT_TRUE(WIFEXITED(status)) << status;
    ASSERT_NE(WEXITSTATUS(status), 1)
        << "connection " << i << " from uid 65534 (not allowed) was handed to gRPC, which "
        << "answered it";
    ASSERT_EQ(WEXITSTATUS(status), 0) << "child setup failed at step " << WEXITSTATUS(status);
  }
  EXPECT_EQ(d.orch->peers_refused(), 64u);
  EXPECT_TRUE(WaitFor([&] { return count_fds() <= fds_before; }))
      << count_fds() << " descriptors open, " << fds_before << " before the refused connections";
  // The daemon's own uid is still served.
  HostClocks clocks;
  auto c = d.Connect(0, clocks);
  EXPECT_TRUE(c.ok()) << c.status();
}

}  // namespace
}  // namespace cxlkv::orchestrator
