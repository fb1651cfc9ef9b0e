// cxlkv-prefix-share: the quickstart's cross-host job. Two host processes join a running
// cxlkv-orchestrator: host 0 prefills KV blocks for a set of shared prompt prefixes (system
// prompts, documents) into an arena in an extent of the pooled region the orchestrator lends
// it, and publishes them; host 1 resolves them in that extent and serves
// requests that start with those prefixes, leases each request's prefix in one pass
// (AcquireChain), reads the blocks out (ReadLeased: the lease kept for the whole copy on a busy
// host), checks every byte it uses against what host 0 wrote, and validates each copy. Host 1
// starts serving once host 0 reports its blocks visible (a pipe), so every request could reuse
// its whole shared prefix. Prints what was shared, what was reused (of what could be), the
// lease latency, what a busy machine cost (leases refused late, copies retried or discarded,
// pauses, fences), and stopped-and-resumed recovery; --min-reuse makes too little reuse an
// error, --json prints the figures as one JSON object.
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "cleanup_on_signal.h"
#include "cxlkv/allocator/block_allocator.h"
#include "cxlkv/base/mutex.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/orchestrator/client.h"
#include "cxlkv/orchestrator/pooled_arenas.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"

namespace {

namespace co = cxlkv::coherence;
using cxlkv::allocator::BlockAllocator;
using cxlkv::allocator::BlockHandle;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string socket;
  std::string layout = "llama3-70b";
  double seconds = 5;
  std::uint32_t prefixes = 8;
  std::uint32_t blocks = 16;       // per prefix: 256 tokens at 16 tokens a block
  std::uint32_t check_bytes = 64 << 10;  // copied and checked per leased block
  double min_reuse = 0;  // fail when host 1 reuses less than this fraction of what it could
  bool json = false;
};

struct Report {
  std::uint64_t published = 0, copy_in_ns = 0, post_ns = 0, drain_ns = 0, bytes_written = 0;
  std::uint64_t requests = 0, blocks_leased = 0, blocks_missed = 0, chain_ns = 0;
  std::uint64_t bytes_copied = 0, copy_ns = 0, bad_bytes = 0, discarded = 0, returned = 0;
  std::uint64_t rejoins = 0;
  // Host 1: blocks whose validated copy it used, shared blocks its requests asked for, and
  // requests that could lease nothing (no acknowledged heartbeat: served by recomputing).
  std::uint64_t reused = 0, shared_asked = 0, refused_requests = 0;
  std::uint64_t lease_p50_ns = 0, lease_p99_ns = 0, lease_max_ns = 0;
  cxlkv::coherence::PrefixHost::Stats stats{};
  // Stops of host 1's own process seen from inside (a gap in its loop over 300 ms: SIGSTOP,
  // a VM stop, starvation), and the longest time from running again to a validated copy.
  std::uint64_t stops = 0, longest_stop_ms = 0, worst_recovery_ms = 0;
  char error[160] = {};
};

std::uint64_t Ns(Clock::time_point a, Clock::time_point b) {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}

// The bytes of block `b` of prefix `p`: what prefill would have computed.
void Fill(std::byte* dst, std::size_t n, std::uint32_t p, std::uint32_t b) {
  std::uint64_t x = (std::uint64_t{p} << 32 | b) * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i + 8 <= n; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(dst + i, &x, 8);
  }
}

std::vector<co::PrefixKey> Keys(co::Namespace ns, std::uint32_t p, std::uint32_t n) {
  std::vector<co::PrefixKey> keys;
  co::PrefixKey parent{};
  std::vector<std::uint32_t> tokens(16);
  for (std::uint32_t b = 0; b < n; ++b) {
    for (std::uint32_t t = 0; t < 16; ++t) tokens[t] = p * 100000 + b * 16 + t;
    parent = co::ChainKey(ns, parent, tokens);
    keys.push_back(parent);
  }
  return keys;
}

const co::Namespace kNs = co::MakeNamespace("quickstart", "llama3-70b", "fp16-l80-h8-d128-t16");

bool Fail(Report& r, const std::string& what) {
  std::snprintf(r.error, sizeof(r.error), "%s", what.c_str());
  return false;
}

// Host 0 writes one byte here once its blocks are visible to every host (host 1 starts then).
bool Publisher(const Options& o, Report& r, int published_fd) {
  auto client = cxlkv::orchestrator::HostClient::Connect(o.socket, 0);
  if (!client.ok()) return Fail(r, std::string(client.status().message()));
  (*client)->StartHeartbeats();
  // Host 0's KV arena: one extent of the domain's pool, lent by the orchestrator.
  cxlkv::orchestrator::PooledArenas pooled(**client);
  auto layout = cxlkv::pool::ParseKvLayout(o.layout);
  if (!layout.ok()) return Fail(r, std::string(layout.status().message()));
  cxlkv::pool::FormatOptions fo;
  fo.layout = *layout;
  auto grown = pooled.Grow(fo);
  if (!grown.ok()) return Fail(r, std::string(grown.status().message()));
  auto alloc = BlockAllocator::Create(std::move(grown->arena));
  if (!alloc.ok()) return Fail(r, std::string(alloc.status().message()));
  auto dom = cxlkv::pool::OpenRegion((*client)->domain_spec());
  if (!dom.ok()) return Fail(r, std::string(dom.status().message()));
  co::DirectMem mem((*dom)->addr(), (*dom)->size_bytes());
  co::SteadyClock clock;
  auto host = co::PrefixHost::Join(mem, clock, 0);
  if (!host.ok()) return Fail(r, std::string(host.status().message()));
  const std::size_t block_bytes = (*alloc)->arena().class_record(0).block_bytes;
  const std::uint32_t ring = (*host)->header().ring_slots;
  std::vector<std::byte> buf(block_bytes);
  std::vector<co::PublishItem> items;
  std::vector<BlockHandle> handles;
  std::vector<co::BlockRef> returned_early;  // none expected: nothing is retired meanwhile
  auto last_drain_beat = Clock::now();
  for (std::uint32_t p = 0; p < o.prefixes; ++p) {
    const auto keys = Keys(kNs, p, o.blocks);
    items.clear();
    handles.clear();
    for (std::uint32_t b = 0; b < o.blocks; ++b) {
      const BlockHandle h = (*alloc)->Alloc(0);
      if (!h.valid()) return Fail(r, std::string((*alloc)->ExplainAllocFailure(0).message()));
      Fill(buf.data(), buf.size(), p, b);  // prefill's output (not timed)
      // A serving host beats on a thread of its own while it computes; here, between blocks
      // (filling 5 MiB takes long on a busy machine, and a host that does not beat for
      // host_ttl is fenced and its requests ignored).
      if (auto hb = (*host)->Heartbeat(&returned_early); absl::IsAborted(hb)) {
        return Fail(r, "host 0 was fenced during its prefill: " + std::string(hb.message()));
      }
      // The block's pages are faulted in untimed (one byte a page): a prefill host reuses
      // its blocks, so the copy measured is the streaming copy, not the first touch.
      auto* dst = static_cast<volatile std::byte*>((*alloc)->Addr(h));
      for (std::size_t off = 0; off < buf.size(); off += 4096) dst[off] = std::byte{0};
      const auto t0 = Clock::now();
      co::CopyNt((*alloc)->Addr(h), buf.data(), buf.size());  // streaming stores: fence only
      r.copy_in_ns += Ns(t0, Clock::now());
      co::BlockRef ref{};
      std::memcpy(ref.arena, (*alloc)->arena().uuid().data(), 16);
      ref.index = h.index;
      ref.generation = h.generation;
      items.push_back(co::PublishItem{keys[b], b ? keys[b - 1] : co::PrefixKey{}, ref});
      handles.push_back(h);
      ++r.published;
      r.bytes_written += buf.size();
    }
    // The prefix's blocks in one ring transaction (in parts of the ring's size), each block
    // persisted in the arena before the announcement; when the ring is full, wait for the
    // owner by polling its line.
    const auto t0 = Clock::now();
    for (std::size_t first = 0; first < items.size(); first += ring) {
      const std::size_t n = std::min<std::size_t>(ring, items.size() - first);
      const std::span<const co::PublishItem> part(items.data() + first, n);
      auto persist = [&] {
        for (std::size_t i = first; i < first + n; ++i) {
          if (!(*alloc)->Persist(handles[i]).ok()) return false;
        }
        return true;
      };
      absl::Status st = (*host)->PublishChain(kNs, part, persist);
      if (absl::IsUnavailable(st)) {
        const absl::Status wait = (*host)->WaitForRingRoom(static_cast<std::uint32_t>(n), 5000);
        st = wait.ok() ? (*host)->PublishChain(kNs, part, persist) : wait;
      }
      if (!st.ok()) return Fail(r, std::string(st.message()));
    }
    r.post_ns += Ns(t0, Clock::now());
  }
  // Until the owner has applied every request (its step period bounds the wait): then every
  // block is visible to a lookup by any host.
  // Waits while the owner makes progress; fails after 30 s without any (the owner is down),
  // or when this host finds it was fenced (its requests would never be applied).
  const auto d0 = Clock::now();
  auto progress_at = d0;
  for (std::uint64_t pending = (*host)->RequestsPending(true); pending != 0;) {
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    const std::uint64_t now_pending = (*host)->RequestsPending(true);
    if (now_pending < pending) progress_at = Clock::now();
    pending = now_pending;
    if (Clock::now() - progress_at > std::chrono::seconds(30)) {
      return Fail(r, "the owner applied none of host 0's requests for 30 s");
    }
    if (Clock::now() - last_drain_beat > std::chrono::milliseconds(100)) {
      last_drain_beat = Clock::now();
      if (auto hb = (*host)->Heartbeat(&returned_early); absl::IsAborted(hb)) {
        return Fail(r, "host 0 was fenced before the owner applied its requests: " +
                           std::string(hb.message()));
      }
    }
  }
  r.drain_ns = Ns(d0, Clock::now());
  const char ready[2] = {1, 1};  // one byte for host 1, one for the parent
  (void)!write(published_fd, ready, sizeof(ready));
  ::close(published_fd);
  const auto end = Clock::now() + std::chrono::duration<double>(o.seconds);
  std::vector<co::BlockRef> back;
  while (Clock::now() < end) {
    (void)(*host)->Heartbeat(&back);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  r.returned = back.size();
  r.rejoins = (*client)->rejoins();
  return true;
}

// Waits (up to 120 s) for host 0's byte on `fd`: false if host 0 ended without sending it.
// `tick` runs every 100 ms meanwhile (a host keeps beating while it waits).
bool WaitForPublisher(int fd, const std::function<void()>& tick = {}) {
  pollfd p{fd, POLLIN, 0};
  for (int waited_ms = 0; waited_ms < 120000;) {
    const int n = ::poll(&p, 1, 100);
    if (n < 0 && errno == EINTR) continue;
    if (n != 0) break;
    waited_ms += 100;
    if (tick) tick();
  }
  char c = 0;
  return (p.revents & POLLIN) != 0 && ::read(fd, &c, 1) == 1;
}

bool Reuser(const Options& o, Report& r, int published_fd) {
  auto client = cxlkv::orchestrator::HostClient::Connect(o.socket, 1);
  if (!client.ok()) return Fail(r, std::string(client.status().message()));
  // Counters since the last heartbeat, as the orchestrator adds them up, and the lease
  // counters as of the last request (the heartbeat thread reads a copy: PrefixHost is this
  // thread's alone).
  std::atomic<std::uint64_t> hits{0}, misses{0};
  cxlkv::base::Mutex stats_mu;
  co::PrefixHost::Stats stats_seen{};
  (*client)->StartHeartbeats([&] {
    cxlkv::orchestrator::HostCounters c;
    c.prefix_hits = hits.exchange(0);
    c.prefix_misses = misses.exchange(0);
    cxlkv::base::MutexLock l(stats_mu);
    c.lease = stats_seen;
    return c;
  });
  // Host 0's blocks live in its extent: resolved through the orchestrator's extent table.
  cxlkv::orchestrator::PooledArenas pooled(**client);
  auto dom = cxlkv::pool::OpenRegion((*client)->domain_spec());
  if (!dom.ok()) return Fail(r, std::string(dom.status().message()));
  co::DirectMem mem((*dom)->addr(), (*dom)->size_bytes());
  co::SteadyClock clock;
  co::PrefixHost::Options ho;
  ho.ack_wait_ms = co::PrefixHost::kRealAckWaitMs;
  auto host = co::PrefixHost::Join(mem, clock, 1, ho);
  if (!host.ok()) return Fail(r, std::string(host.status().message()));
  if (!WaitForPublisher(published_fd, [&] { (void)(*host)->Heartbeat(nullptr); })) {
    return Fail(r, "host 0 published nothing (see its error)");
  }
  std::mt19937_64 rng(42);
  std::vector<std::byte> copy(o.check_bytes), want(o.check_bytes);
  std::vector<co::Lease> leases;
  std::vector<std::uint64_t> lease_ns;
  lease_ns.reserve(1 << 20);
  const auto end = Clock::now() + std::chrono::duration<double>(o.seconds);
  auto last_beat = Clock::now(), last_loop = Clock::now();
  Clock::time_point resumed{};  // when host 1 last ran again after a stop; unset: none pending
  while (Clock::now() < end) {
    const auto loop = Clock::now();
    if (loop - last_loop > std::chrono::milliseconds(300)) {
      // This process did not run for a while (stopped, or starved): time its recovery.
      ++r.stops;
      r.longest_stop_ms = std::max<std::uint64_t>(
          r.longest_stop_ms,
          static_cast<std::uint64_t>(
              std::chrono::duration_cast<std::chrono::milliseconds>(loop - last_loop).count()));
      resumed = loop;
    }
    last_loop = loop;
    if (loop - last_beat > std::chrono::milliseconds(100)) {
      (void)(*host)->Heartbeat(nullptr);
      last_beat = Clock::now();
    }
    // A request: one of the shared prefixes, then a few blocks of its own (never shared).
    const auto p = static_cast<std::uint32_t>(rng() % o.prefixes);
    const std::uint32_t own = 1 + static_cast<std::uint32_t>(rng() % 4);
    const auto keys = Keys(kNs, p, o.blocks + own);
    leases.clear();
    ++r.requests;
    r.shared_asked += o.blocks;
    const auto t0 = Clock::now();
    auto n = (*host)->AcquireChain(kNs, keys, &leases);
    if (!n.ok() && absl::IsAborted(n.status())) {
      n = (*host)->AcquireChain(kNs, keys, &leases);  // fenced or paused: learnt; lease again
    }
    const std::uint64_t took = Ns(t0, Clock::now());
    r.chain_ns += took;
    lease_ns.push_back(took);
    if (!n.ok()) {
      // No lease could be promised: this request recomputes its whole prefix.
      ++r.refused_requests;
      r.blocks_missed += keys.size();
      misses.fetch_add(keys.size());
      continue;
    }
    r.blocks_leased += *n;
    r.blocks_missed += keys.size() - *n;
    std::uint64_t used = 0;
    for (std::size_t b = 0; b < leases.size(); ++b) {
      co::Lease& l = leases[b];
      auto addr = pooled.Resolve(l.ref);
      if (!addr.ok()) {
        return Fail(r, "a leased block is not allocated in its publisher's extent arena: " +
                           std::string(addr.status().message()));
      }
      const auto c0 = Clock::now();
      // Another host wrote it: read memory, not a stale line; the lease kept for the whole
      // copy (renewed, or taken again if the host was descheduled), then the generation checked.
      const absl::Status copied = (*host)->ReadLeased(l, *addr, copy.data(), copy.size());
      r.copy_ns += Ns(c0, Clock::now());
      if (!copied.ok()) {
        ++r.discarded;
        continue;
      }
      ++used;
      r.bytes_copied += copy.size();
      Fill(want.data(), want.size(), p, static_cast<std::uint32_t>(b));
      if (std::memcmp(copy.data(), want.data(), copy.size()) != 0) ++r.bad_bytes;
    }
    (*host)->ReleaseAll(leases);
    r.reused += used;
    {
      cxlkv::base::MutexLock l(stats_mu);
      stats_seen = (*host)->stats();
    }
    hits.fetch_add(used);
    misses.fetch_add(keys.size() - used);
    if (used > 0 && resumed != Clock::time_point{}) {
      r.worst_recovery_ms = std::max<std::uint64_t>(
          r.worst_recovery_ms,
          static_cast<std::uint64_t>(
              std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - resumed)
                  .count()));
      resumed = Clock::time_point{};
    }
  }
  if (!lease_ns.empty()) {
    std::sort(lease_ns.begin(), lease_ns.end());
    r.lease_p50_ns = lease_ns[lease_ns.size() / 2];
    r.lease_p99_ns = lease_ns[std::min(lease_ns.size() - 1, lease_ns.size() * 99 / 100)];
    r.lease_max_ns = lease_ns.back();
  }
  r.stats = (*host)->stats();
  r.rejoins = (*client)->rejoins();
  return true;
}

}  // namespace

// An exception escaping main (CLI11, the standard library: a bug or memory exhaustion) ends the
// program through std::terminate, which names it: the wanted end, so nothing catches it here.
// NOLINTNEXTLINE(bugprone-exception-escape)
int main(int argc, char** argv) {
  CLI::App app{"cxlkv-prefix-share: two hosts share prompt prefixes through cxlkv-orchestrator"};
  Options o;
  app.add_option("--socket", o.socket, "the orchestrator's Unix socket")->required();
  app.add_option("--layout", o.layout, "KV layout of host 0's arena (in an extent it grows)");
  app.add_option("--seconds", o.seconds, "how long host 1 serves requests");
  app.add_option("--prefixes", o.prefixes, "shared prefixes host 0 publishes")->check(CLI::Range(1, 1000));
  app.add_option("--blocks", o.blocks, "blocks per prefix (16 tokens each)")->check(CLI::Range(1, 256));
  app.add_option("--min-reuse", o.min_reuse,
                 "exit 1 when host 1 reuses less than this fraction of the shared blocks its "
                 "requests asked for (0: only when it reuses nothing)")
      ->check(CLI::Range(0.0, 1.0));
  std::uint32_t stop_ms = 0;
  app.add_option("--stop-serving-host", stop_ms,
                 "SIGSTOP host 1 for this many ms a third into its run, then SIGCONT it (a "
                 "descheduled or stopped host); its recovery is reported")
      ->check(CLI::Range(0, 60000));
  app.add_flag("--json", o.json, "print the figures as one JSON object instead of the summary");
  CLI11_PARSE(app, argc, argv);

  Report reports[2];
  int fds[2][2];
  pid_t pids[2];
  // Host 0 sends a byte down this pipe to host 1 and one to this process once its blocks are
  // visible: host 1 serves from then on, and a --stop-serving-host stop is timed from then.
  int published[2];
  if (pipe2(published, O_CLOEXEC) != 0) return 1;
  // Each report pipe's write end lives in its host alone: when a host dies, its pipe reads EOF
  // and the report below says so (the parent and the other host hold no copy of it).
  for (int i = 0; i < 2; ++i) {
    if (pipe2(fds[i], O_CLOEXEC) != 0) return 1;
    // The hosts die with this process, however it ends (it creates no files of its own).
    pids[i] = cxlkv::tools::CleanupOnSignal::Fork();
    if (pids[i] < 0) return 1;
    if (pids[i] == 0) {
      ::close(fds[i][0]);
      for (int j = 0; j < i; ++j) ::close(fds[j][0]);  // the earlier host's read end
      Report r;
      bool ok = false;
      if (i == 0) {
        ::close(published[0]);
        ok = Publisher(o, r, published[1]);
      } else {
        ok = Reuser(o, r, published[0]);
      }
      (void)!write(fds[i][1], &r, sizeof(r));
      _exit(ok ? 0 : 1);
    }
    ::close(fds[i][1]);
    // Only host 0 writes the pipe: when it ends, host 1 and this process read EOF.
    if (i == 0) ::close(published[1]);
  }
  if (stop_ms != 0 && WaitForPublisher(published[0])) {
    std::this_thread::sleep_for(std::chrono::duration<double>(o.seconds / 3));
    ::kill(pids[1], SIGSTOP);
    std::this_thread::sleep_for(std::chrono::milliseconds(stop_ms));
    ::kill(pids[1], SIGCONT);
  }
  ::close(published[0]);
  int failed = 0;
  for (int i = 0; i < 2; ++i) {
    ssize_t got = 0;
    auto* into = reinterpret_cast<char*>(&reports[i]);
    while (got < static_cast<ssize_t>(sizeof(Report))) {
      const ssize_t n = read(fds[i][0], into + got, sizeof(Report) - static_cast<std::size_t>(got));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += n;
    }
    ::close(fds[i][0]);
    int status = 0;
    waitpid(pids[i], &status, 0);
    if (got != static_cast<ssize_t>(sizeof(Report))) {
      reports[i] = Report{};
      if (WIFSIGNALED(status)) {
        std::snprintf(reports[i].error, sizeof(reports[i].error),
                      "host %d (pid %d) died (signal %d) before reporting", i, pids[i],
                      WTERMSIG(status));
      } else {
        std::snprintf(reports[i].error, sizeof(reports[i].error),
                      "host %d (pid %d) exited (status %d) before reporting", i, pids[i],
                      WIFEXITED(status) ? WEXITSTATUS(status) : -1);
      }
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 ||
        got != static_cast<ssize_t>(sizeof(Report))) {
      std::fprintf(stderr, "cxlkv-prefix-share: host %d failed: %s\n", i, reports[i].error);
      ++failed;
    }
  }
  const Report& a = reports[0];
  const Report& b = reports[1];
  const double mib = static_cast<double>(a.bytes_written) / (1 << 20);
  const double copy_gbps =
      a.copy_in_ns ? static_cast<double>(a.bytes_written) / static_cast<double>(a.copy_in_ns) : 0.0;
  const std::uint64_t e2e_ns = a.copy_in_ns + a.post_ns + a.drain_ns;
  const double publish_gbps =
      e2e_ns ? static_cast<double>(a.bytes_written) / static_cast<double>(e2e_ns) : 0.0;
  if (!o.json) {
    std::printf(
        "host 0 (prefill): published %llu blocks (%llu prefixes x %u, one ring transaction "
        "a prefix), %.1f MiB\n",
        static_cast<unsigned long long>(a.published), static_cast<unsigned long long>(o.prefixes),
        o.blocks, mib);
    std::printf(
        "                  copy-in %.2f GB/s (streaming stores alone); publish %.2f GB/s end "
        "to end (copy-in + chain requests + the owner applying them), %.0f %% of the copy\n",
        copy_gbps, publish_gbps, copy_gbps > 0 ? 100.0 * publish_gbps / copy_gbps : 0.0);
    std::printf(
        "                  %.1f us per block: copy %.1f, requests %.1f, owner catching up "
        "%.1f (its step period)\n",
        a.published ? static_cast<double>(e2e_ns) / static_cast<double>(a.published) / 1e3 : 0.0,
        a.published ? static_cast<double>(a.copy_in_ns) / static_cast<double>(a.published) / 1e3
                    : 0.0,
        a.published ? static_cast<double>(a.post_ns) / static_cast<double>(a.published) / 1e3 : 0.0,
        a.published ? static_cast<double>(a.drain_ns) / static_cast<double>(a.published) / 1e3
                    : 0.0);
  }
  // Every key a request asked for was leased or missed; a block counts as reused only when
  // its validated copy was used.
  const std::uint64_t asked = b.blocks_missed + b.blocks_leased;
  const double hit =
      asked ? 100.0 * static_cast<double>(b.reused) / static_cast<double>(asked) : 0.0;
  const double reuse =
      b.shared_asked ? static_cast<double>(b.reused) / static_cast<double>(b.shared_asked) : 0.0;
  const double most = 100.0 * o.blocks / (o.blocks + 2.5);  // own blocks: 1-4, 2.5 on average
  const auto& st = b.stats;
  if (o.json) {
    std::printf(
        "{\"published\": %llu, \"requests\": %llu, \"reused\": %llu, \"shared_asked\": %llu, "
        "\"reuse\": %.4f, \"block_hit_rate\": %.4f, \"most_hit_rate\": %.4f, "
        "\"refused_requests\": %llu, \"lease_p50_us\": %.2f, \"lease_p99_us\": %.2f, "
        "\"lease_max_us\": %.2f, \"copies_discarded\": %llu, \"copies_retried\": %llu, "
        "\"leases_retaken\": %llu, \"leases_renewed_for_copy\": %llu, "
        "\"leases_refused_late\": %llu, \"ack_waits\": %llu, \"pauses_detected\": %llu, "
        "\"rejoins_after_fence\": %llu, \"stops\": %llu, \"longest_stop_ms\": %llu, "
        "\"worst_recovery_ms\": %llu, \"bad_bytes\": %llu}\n",
        static_cast<unsigned long long>(a.published), static_cast<unsigned long long>(b.requests),
        static_cast<unsigned long long>(b.reused), static_cast<unsigned long long>(b.shared_asked),
        reuse, hit / 100.0, most / 100.0, static_cast<unsigned long long>(b.refused_requests),
        static_cast<double>(b.lease_p50_ns) / 1e3, static_cast<double>(b.lease_p99_ns) / 1e3,
        static_cast<double>(b.lease_max_ns) / 1e3, static_cast<unsigned long long>(b.discarded),
        static_cast<unsigned long long>(st.copies_retried),
        static_cast<unsigned long long>(st.leases_retaken),
        static_cast<unsigned long long>(st.leases_renewed_for_copy),
        static_cast<unsigned long long>(st.leases_refused_late),
        static_cast<unsigned long long>(st.ack_waits),
        static_cast<unsigned long long>(st.pauses_detected),
        static_cast<unsigned long long>(st.rejoins_after_fence),
        static_cast<unsigned long long>(b.stops),
        static_cast<unsigned long long>(b.longest_stop_ms),
        static_cast<unsigned long long>(b.worst_recovery_ms),
        static_cast<unsigned long long>(b.bad_bytes));
  } else {
    std::printf(
        "host 1 (serve):   %llu requests, %llu prefix blocks reused, %llu computed (block "
        "hit rate %.1f %%, the most a request can reuse: %.1f %%)\n",
        static_cast<unsigned long long>(b.requests), static_cast<unsigned long long>(b.reused),
        static_cast<unsigned long long>(b.blocks_missed + b.blocks_leased - b.reused), hit, most);
    std::printf(
        "                  reused %.1f %% of the shared blocks its requests asked for; "
        "%llu requests could lease nothing\n",
        100.0 * reuse, static_cast<unsigned long long>(b.refused_requests));
    std::printf(
        "                  lease a request's prefix: %.2f us mean, p50 %.2f us, p99 %.2f us "
        "(%.0f ns per block, lookups + leases + re-validation)\n",
        b.requests ? static_cast<double>(b.chain_ns) / static_cast<double>(b.requests) / 1e3 : 0.0,
        static_cast<double>(b.lease_p50_ns) / 1e3, static_cast<double>(b.lease_p99_ns) / 1e3,
        b.blocks_leased ? static_cast<double>(b.chain_ns) / static_cast<double>(b.blocks_leased)
                        : 0.0);
    std::printf(
        "                  copied %.1f MiB out of shared blocks at %.2f GB/s; %llu copies "
        "discarded by validation; %llu blocks with wrong bytes\n",
        static_cast<double>(b.bytes_copied) / (1 << 20),
        b.copy_ns ? static_cast<double>(b.bytes_copied) / static_cast<double>(b.copy_ns) : 0.0,
        static_cast<unsigned long long>(b.discarded), static_cast<unsigned long long>(b.bad_bytes));
    std::printf(
        "                  busy host: %llu leases renewed to last a copy, %llu taken again "
        "and copies retried %llu, %llu acquires refused late, %llu waits for an "
        "acknowledgement, %llu pauses detected, %llu fences\n",
        static_cast<unsigned long long>(st.leases_renewed_for_copy),
        static_cast<unsigned long long>(st.leases_retaken),
        static_cast<unsigned long long>(st.copies_retried),
        static_cast<unsigned long long>(st.leases_refused_late),
        static_cast<unsigned long long>(st.ack_waits),
        static_cast<unsigned long long>(st.pauses_detected),
        static_cast<unsigned long long>(st.rejoins_after_fence));
    if (b.stops != 0) {
      std::printf(
          "                  stopped %llu times (longest %llu ms); served again %llu ms "
          "after running again at worst\n",
          static_cast<unsigned long long>(b.stops),
          static_cast<unsigned long long>(b.longest_stop_ms),
          static_cast<unsigned long long>(b.worst_recovery_ms));
    }
  }
  if (b.bad_bytes != 0) {
    std::fprintf(stderr, "cxlkv-prefix-share: host 1 read wrong bytes from %llu shared blocks\n",
                 static_cast<unsigned long long>(b.bad_bytes));
    ++failed;
  }
  if (b.reused == 0) {
    std::fprintf(stderr, "cxlkv-prefix-share: host 1 reused nothing\n");
    ++failed;
  } else if (reuse < o.min_reuse) {
    std::fprintf(stderr,
                 "cxlkv-prefix-share: SHARING FAILED: host 1 reused %.1f %% of the shared blocks "
                 "its requests asked for, below the %.0f %% asked (--min-reuse); %llu requests "
                 "could lease nothing, %llu copies were discarded, %llu acquires refused late, "
                 "%llu pauses and %llu fences on host 1 (a loaded or stopped machine?)\n",
                 100.0 * reuse, 100.0 * o.min_reuse,
                 static_cast<unsigned long long>(b.refused_requests),
                 static_cast<unsigned long long>(b.discarded),
                 static_cast<unsigned long long>(st.leases_refused_late),
                 static_cast<unsigned long long>(st.pauses_detected),
                 static_cast<unsigned long long>(st.rejoins_after_fence));
    ++failed;
  }
  return failed ? 1 : 0;
}
