// cxlkv-prefix-share: the quickstart's cross-host job. Two host processes join a running
// cxlkv-orchestrator: host 0 prefills KV blocks for a set of shared prompt prefixes (system
// prompts, documents) into an arena in an extent of the pooled region the orchestrator lends
// it, and publishes them; host 1 resolves them in that extent and serves
// requests that start with those prefixes, leases each request's prefix in one pass
// (AcquireChain), copies the blocks out, checks every byte it uses against what host 0 wrote,
// and validates each copy. Prints what was shared, what was reused and what it cost.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "cleanup_on_signal.h"
#include "cxlkv/allocator/block_allocator.h"
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
};

struct Report {
  std::uint64_t published = 0, copy_in_ns = 0, post_ns = 0, drain_ns = 0, bytes_written = 0;
  std::uint64_t requests = 0, blocks_leased = 0, blocks_missed = 0, chain_ns = 0;
  std::uint64_t bytes_copied = 0, copy_ns = 0, bad_bytes = 0, discarded = 0, returned = 0;
  std::uint64_t rejoins = 0;
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

bool Publisher(const Options& o, Report& r) {
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
  for (std::uint32_t p = 0; p < o.prefixes; ++p) {
    const auto keys = Keys(kNs, p, o.blocks);
    items.clear();
    handles.clear();
    for (std::uint32_t b = 0; b < o.blocks; ++b) {
      const BlockHandle h = (*alloc)->Alloc(0);
      if (!h.valid()) return Fail(r, std::string((*alloc)->ExplainAllocFailure(0).message()));
      Fill(buf.data(), buf.size(), p, b);  // prefill's output (not timed)
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
  const auto d0 = Clock::now();
  while ((*host)->RequestsPending(true) != 0) {
    if (Clock::now() - d0 > std::chrono::seconds(5))
      return Fail(r, "the owner applied nothing for 5 s");
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  r.drain_ns = Ns(d0, Clock::now());
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

bool Reuser(const Options& o, Report& r) {
  auto client = cxlkv::orchestrator::HostClient::Connect(o.socket, 1);
  if (!client.ok()) return Fail(r, std::string(client.status().message()));
  (*client)->StartHeartbeats([&r] {
    cxlkv::orchestrator::HostCounters c;
    c.prefix_hits = r.blocks_leased;  // cumulative here; the orchestrator adds what it gets
    return c;
  });
  // Host 0's blocks live in its extent: resolved through the orchestrator's extent table.
  cxlkv::orchestrator::PooledArenas pooled(**client);
  auto dom = cxlkv::pool::OpenRegion((*client)->domain_spec());
  if (!dom.ok()) return Fail(r, std::string(dom.status().message()));
  co::DirectMem mem((*dom)->addr(), (*dom)->size_bytes());
  co::SteadyClock clock;
  auto host = co::PrefixHost::Join(mem, clock, 1);
  if (!host.ok()) return Fail(r, std::string(host.status().message()));
  std::mt19937_64 rng(42);
  std::vector<std::byte> copy(o.check_bytes), want(o.check_bytes);
  std::vector<co::Lease> leases;
  const auto end = Clock::now() + std::chrono::duration<double>(o.seconds);
  auto last_beat = Clock::now();
  while (Clock::now() < end) {
    if (Clock::now() - last_beat > std::chrono::milliseconds(100)) {
      (void)(*host)->Heartbeat(nullptr);
      last_beat = Clock::now();
    }
    // A request: one of the shared prefixes, then a few blocks of its own (never shared).
    const auto p = static_cast<std::uint32_t>(rng() % o.prefixes);
    const std::uint32_t own = 1 + static_cast<std::uint32_t>(rng() % 4);
    const auto keys = Keys(kNs, p, o.blocks + own);
    leases.clear();
    const auto t0 = Clock::now();
    auto n = (*host)->AcquireChain(kNs, keys, &leases);
    r.chain_ns += Ns(t0, Clock::now());
    if (!n.ok()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // not yet live: beat first
      (void)(*host)->Heartbeat(nullptr);
      continue;
    }
    ++r.requests;
    r.blocks_leased += *n;
    r.blocks_missed += keys.size() - *n;
    for (std::size_t b = 0; b < leases.size(); ++b) {
      const co::Lease& l = leases[b];
      auto addr = pooled.Resolve(l.ref);
      if (!addr.ok()) {
        return Fail(r, "a leased block is not allocated in its publisher's extent arena: " +
                           std::string(addr.status().message()));
      }
      const auto c0 = Clock::now();
      // Another host wrote it: read memory, not a stale line; then check the generation.
      const absl::Status copied = (*host)->CopyOut(l, *addr, copy.data(), copy.size());
      r.copy_ns += Ns(c0, Clock::now());
      if (!copied.ok()) {
        ++r.discarded;
        continue;
      }
      r.bytes_copied += copy.size();
      Fill(want.data(), want.size(), p, static_cast<std::uint32_t>(b));
      if (std::memcmp(copy.data(), want.data(), copy.size()) != 0) ++r.bad_bytes;
    }
    (*host)->ReleaseAll(leases);
  }
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
  CLI11_PARSE(app, argc, argv);

  Report reports[2];
  int fds[2][2];
  pid_t pids[2];
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
      const bool ok = i == 0 ? Publisher(o, r) : Reuser(o, r);
      (void)!write(fds[i][1], &r, sizeof(r));
      _exit(ok ? 0 : 1);
    }
    ::close(fds[i][1]);
    if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // prefill first
  }
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
      a.published ? static_cast<double>(a.drain_ns) / static_cast<double>(a.published) / 1e3 : 0.0);
  const double hit = b.blocks_leased + b.blocks_missed
                         ? 100.0 * static_cast<double>(b.blocks_leased) /
                               static_cast<double>(b.blocks_leased + b.blocks_missed)
                         : 0.0;
  std::printf("host 1 (serve):   %llu requests, %llu prefix blocks reused, %llu computed (block hit "
              "rate %.1f %%)\n",
              static_cast<unsigned long long>(b.requests), static_cast<unsigned long long>(b.blocks_leased),
              static_cast<unsigned long long>(b.blocks_missed), hit);
  std::printf("                  lease a request's prefix: %.2f us (%.0f ns per block, lookups + "
              "leases + re-validation)\n",
              b.requests ? static_cast<double>(b.chain_ns) / static_cast<double>(b.requests) / 1e3 : 0.0,
              b.blocks_leased ? static_cast<double>(b.chain_ns) / static_cast<double>(b.blocks_leased) : 0.0);
  std::printf("                  copied %.1f MiB out of shared blocks at %.2f GB/s; %llu copies "
              "discarded by validation; %llu blocks with wrong bytes\n",
              static_cast<double>(b.bytes_copied) / (1 << 20),
              b.copy_ns ? static_cast<double>(b.bytes_copied) / static_cast<double>(b.copy_ns) : 0.0,
              static_cast<unsigned long long>(b.discarded), static_cast<unsigned long long>(b.bad_bytes));
  if (b.bad_bytes != 0) {
    std::fprintf(stderr, "cxlkv-prefix-share: host 1 read wrong bytes from %llu shared blocks\n",
                 static_cast<unsigned long long>(b.bad_bytes));
    ++failed;
  }
  if (b.blocks_leased == 0) {
    std::fprintf(stderr, "cxlkv-prefix-share: host 1 reused nothing\n");
    ++failed;
  }
  return failed ? 1 : 0;
}
