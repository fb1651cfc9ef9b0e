// cxlkv-guest-lease: one host of the shared-prefix lease protocol, for the two-host QEMU
// topology (qemu-cxl/guest-tests/lease-share.sh). Each process is one host of the domain:
// it joins cxlkv-orchestrator over its control plane (a Unix socket on the orchestrator's
// guest, tcp:HOST:PORT with the domain's token from the other guest), and reaches the prefix
// index and the blocks through the shared CXL device both guests map.
//
//   cxlkv-guest-lease serve --endpoint E --host H --prefixes FIRST:N [--blocks B]
//                           [--hold FIRST:N,...] --ready FILE
//     Grows one extent, formats a KV arena in it, writes N prefixes of B blocks each
//     (prefix ids FIRST..FIRST+N-1) with streaming stores and publishes them, waits until the
//     owner lists every one, leases the --hold prefixes (any publisher's) and keeps renewing
//     them, then writes FILE (key=value lines: host, incarnation, extent, arena, published,
//     leases) and keeps heartbeating. On SIGTERM or SIGINT it releases its leases, gives the
//     extent back and leaves. A lapsed capacity lease or a fence while serving is a failure.
//   cxlkv-guest-lease read --endpoint E --host H --prefixes FIRST:N,... [--blocks B]
//                          [--timeout SECS]
//     Leases every block of every named prefix (AcquireChain), resolves each in its
//     publisher's extent, copies the whole block out, validates the lease after the copy and
//     compares every byte with what the publisher wrote; releases every lease and leaves.
//     Waits (up to --timeout) for prefixes not published yet.
//   cxlkv-guest-lease hold --endpoint E --host H --prefixes FIRST:N,... [--blocks B]
//                          [--timeout SECS] --ready FILE
//     As read, but keeps the leases (renewing them) after writing FILE, until SIGTERM; then
//     copies every block again — the bytes must be unchanged: memory under a held lease is
//     never lent again, even after its publisher died — reports how many entries were
//     retired meanwhile (the validation after the copy fails), releases and leaves.
//
// Block content is a function of (arena uuid, prefix id, block number), so a reader that
// got a block of another arena, another prefix or a stale copy sees wrong bytes. Exits 0 on
// success; a failure prints "FAIL: <what>" and exits 1. Data volumes stay small: the CXL
// memory is emulated as MMIO under TCG (tens of MiB/s).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "cxlkv/allocator/block_allocator.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/orchestrator/client.h"
#include "cxlkv/orchestrator/pooled_arenas.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"

namespace {

namespace co = cxlkv::coherence;
namespace orch = cxlkv::orchestrator;
namespace pool = cxlkv::pool;
using cxlkv::allocator::BlockAllocator;
using cxlkv::allocator::BlockHandle;
using Clock = std::chrono::steady_clock;

// 16 KiB blocks: 2 (K, V) x 2 layers x 2 heads x 64 dims x 2 bytes x 16 tokens.
const pool::KvLayout kLayout{2, 2, 64, 2, 16, pool::KvLayoutKind::kContiguous};
const co::Namespace kNs = co::MakeNamespace("qemu", "lease-share", "L=2,H=2,D=64,B=2,T=16");

std::atomic<bool> g_stop{false};

// Exits at once: the heartbeat and gRPC threads are still running, so no destructors.
[[noreturn]] void Fail(const std::string& what) {
  std::printf("FAIL: %s\n", what.c_str());
  std::fflush(stdout);
  std::_Exit(1);
}

template <typename T>
T Must(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Fail(what + ": " + std::string(v.status().message()));
  return std::move(*v);
}

void Log(const std::string& who, const std::string& what) {
  std::printf("%s: %s\n", who.c_str(), what.c_str());
  std::fflush(stdout);
}

// HostClient's calls carry a fixed 2 s deadline; a TCG guest on a busy machine can stall
// longer than that (the first call of a process also sets its gRPC channel up). Calls whose
// repetition is harmless are retried on kDeadlineExceeded / kUnavailable for up to 60 s:
// Join (a repeated join is a new incarnation that supersedes one whose reply was lost),
// Grow (an extent granted to a lost reply is still this host's and returns when it leaves)
// and Resolve (a lookup).
bool Transient(const absl::Status& st) {
  return absl::IsDeadlineExceeded(st) || absl::IsUnavailable(st);
}

template <typename F>
auto Retry(const std::string& what, F call) -> decltype(call()) {
  const auto end = Clock::now() + std::chrono::seconds(60);
  for (int attempt = 1;; ++attempt) {
    auto r = call();
    if (r.ok() || !Transient(r.status()) || Clock::now() > end) return r;
    std::printf("%s: %s (attempt %d); retrying\n", what.c_str(),
                std::string(r.status().message()).c_str(), attempt);
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

// Leaving (and giving an extent back before it) is not repeatable through HostClient; a late
// reply to a request the orchestrator applied is reported, and the caller's checks of the
// orchestrator's state (cxlkvctl hosts) decide.
void MustLeave(orch::HostClient& c, const std::string& who) {
  const absl::Status st = c.Leave();
  if (st.ok()) return;
  if (!Transient(st)) Fail(who + ": leave: " + std::string(st.message()));
  std::printf("%s: leave: %s (the orchestrator's host list will tell)\n", who.c_str(),
              std::string(st.message()).c_str());
}

struct Range {
  std::uint32_t first = 0, count = 0;
};

// "0:4,100:2" -> {0,4}, {100,2}.
std::vector<Range> ParseRanges(const std::string& text) {
  std::vector<Range> out;
  if (text.empty()) return out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::vector<absl::string_view> fc = absl::StrSplit(part, ':');
    Range r;
    if (fc.size() != 2 || !absl::SimpleAtoi(fc[0], &r.first) ||
        !absl::SimpleAtoi(fc[1], &r.count) || r.count == 0) {
      Fail("'" + text + "': give prefix ranges as FIRST:COUNT[,FIRST:COUNT...]");
    }
    out.push_back(r);
  }
  return out;
}

std::vector<std::uint32_t> Expand(const std::vector<Range>& ranges) {
  std::vector<std::uint32_t> ids;
  for (const Range& r : ranges) {
    for (std::uint32_t i = 0; i < r.count; ++i) ids.push_back(r.first + i);
  }
  return ids;
}

// The chained keys of prefix `p`'s blocks 0..n-1.
std::vector<co::PrefixKey> Keys(std::uint32_t p, std::uint32_t n) {
  std::vector<co::PrefixKey> keys;
  co::PrefixKey parent{};
  std::vector<std::uint32_t> tokens(kLayout.tokens_per_block);
  for (std::uint32_t b = 0; b < n; ++b) {
    for (std::uint32_t t = 0; t < tokens.size(); ++t) {
      tokens[t] = p * 100000 + b * kLayout.tokens_per_block + t;
    }
    parent = co::ChainKey(kNs, parent, tokens);
    keys.push_back(parent);
  }
  return keys;
}

// What the publisher writes into block `b` of prefix `p` in arena `arena`.
void Fill(std::byte* dst, std::size_t n, const std::uint8_t* arena, std::uint32_t p,
          std::uint32_t b) {
  std::uint64_t salt = 0;
  std::memcpy(&salt, arena, sizeof(salt));
  std::uint64_t x = ((std::uint64_t{p} << 32 | b) ^ salt) * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i + 8 <= n; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(dst + i, &x, 8);
  }
}

std::string Hex(const std::uint8_t* b, std::size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  for (std::size_t i = 0; i < n; ++i) {
    s += kDigits[b[i] >> 4];
    s += kDigits[b[i] & 15];
  }
  return s;
}

// Joins the control plane (the capacity side) and the prefix domain (the lease side).
// The control plane has its own heartbeat thread; the prefix domain's heartbeat is driven by
// this thread (PrefixHost is single-threaded), through Tick(), at least every 100 ms from
// JoinPrefix() on. A host that stays silent for host_ttl is fenced by the owner, which
// drops its leases and the publications of that incarnation: here that is a failure (the
// guest stalled), reported as such.
struct Host {
  std::string who;
  std::uint32_t id = 0;
  std::unique_ptr<orch::HostClient> client;
  std::unique_ptr<pool::Region> domain;
  std::unique_ptr<co::DirectMem> mem;
  co::SteadyClock clock;
  std::unique_ptr<co::PrefixHost> prefix;
  Clock::time_point last_beat{};
  std::vector<co::BlockRef> returned;  // blocks the owner handed back, for the publisher

  void Beat() {
    if (absl::IsAborted(prefix->Heartbeat(&returned))) {
      Fail(who + ": fenced by the prefix owner (no heartbeat for host_ttl: the guest stalled)");
    }
    last_beat = Clock::now();
  }
  void Tick() {
    if (Clock::now() - last_beat >= std::chrono::milliseconds(100)) Beat();
  }
};

// The control plane: joins, starts its heartbeats, maps the prefix domain it names.
void JoinControl(Host& h, const std::string& endpoint, std::uint32_t id) {
  h.who = "host " + std::to_string(id);
  h.id = id;
  const std::string what = "join " + endpoint + " as host " + std::to_string(id);
  h.client = Must(Retry(what, [&] { return orch::HostClient::Connect(endpoint, id); }), what);
  h.client->StartHeartbeats();
  h.domain =
      Must(pool::OpenRegion(h.client->domain_spec()), "prefix domain " + h.client->domain_spec());
  h.mem = std::make_unique<co::DirectMem>(h.domain->addr(), h.domain->size_bytes());
}

// The prefix domain: from here on, Tick() at least every 100 ms.
void JoinPrefix(Host& h) {
  h.prefix = Must(co::PrefixHost::Join(*h.mem, h.clock, h.id), h.who + ": prefix domain join");
  h.Beat();
}

void Join(Host& h, const std::string& endpoint, std::uint32_t id) {
  JoinControl(h, endpoint, id);
  JoinPrefix(h);
}

// ---- serve --------------------------------------------------------------------------------

struct ServeOptions {
  std::string endpoint, prefixes, hold, ready;
  std::uint32_t host = 0, blocks = 8;
};

int Serve(const ServeOptions& o) {
  const std::string who = "host " + std::to_string(o.host);
  Host h;
  JoinControl(h, o.endpoint, o.host);
  orch::PooledArenas pooled(*h.client);
  pool::FormatOptions fo;
  fo.layout = kLayout;
  fo.owner_slots = 8;
  auto grown =
      Must(Retry(who + ": grow", [&] { return pooled.Grow(fo); }), who + ": grow an extent");
  const std::uint32_t extent = grown.extent;
  const std::atomic<bool>* revoked = grown.revoked;
  auto alloc = Must(BlockAllocator::Create(std::move(grown.arena)), who + ": allocator");
  const pool::Uuid uuid = alloc->arena().uuid();
  const std::size_t block_bytes = alloc->arena().class_record(0).block_bytes;
  Log(who, "incarnation " + std::to_string(h.client->incarnation()) + ", extent " +
               std::to_string(extent) + ", arena " + pool::UuidToString(uuid));
  // Growing and formatting take a while under TCG: join the prefix domain only now.
  JoinPrefix(h);

  // Prefill and publish.
  const std::vector<std::uint32_t> ids = Expand(ParseRanges(o.prefixes));
  std::vector<std::byte> buf(block_bytes);
  std::uint32_t published = 0;
  for (std::uint32_t p : ids) {
    const auto keys = Keys(p, o.blocks);
    for (std::uint32_t b = 0; b < o.blocks; ++b) {
      h.Tick();
      const BlockHandle bh = alloc->Alloc(0);
      if (!bh.valid()) Fail(who + ": " + std::string(alloc->ExplainAllocFailure(0).message()));
      Fill(buf.data(), buf.size(), uuid.data(), p, b);
      co::CopyNt(alloc->Addr(bh), buf.data(), buf.size());  // streaming stores: fenced below
      co::BlockRef ref{};
      std::memcpy(ref.arena, uuid.data(), 16);
      ref.index = bh.index;
      ref.generation = bh.generation;
      absl::Status st;
      for (int tries = 0; tries < 5000; ++tries) {
        st = h.prefix->Publish(kNs, keys[b], b ? keys[b - 1] : co::PrefixKey{}, ref,
                               [&] { return alloc->Persist(bh).ok(); });
        if (!absl::IsUnavailable(st)) break;
        h.Beat();  // ring full: the owner is catching up
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (!st.ok())
        Fail(who + ": publish prefix " + std::to_string(p) + " block " + std::to_string(b) + ": " +
             std::string(st.message()));
      ++published;
    }
  }
  // The owner applies requests asynchronously: wait until the index names every block.
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  for (;;) {
    std::uint32_t seen = 0;
    for (std::uint32_t p : ids) {
      for (const co::PrefixKey& k : Keys(p, o.blocks)) {
        const auto hit = h.prefix->Lookup(kNs, k);
        seen += hit.has_value() && std::memcmp(hit->ref.arena, uuid.data(), 16) == 0;
      }
    }
    if (seen == published) break;
    if (Clock::now() > deadline) {
      Fail(who + ": the owner lists " + std::to_string(seen) + " of " + std::to_string(published) +
           " published blocks after 60 s");
    }
    h.Tick();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  Log(who, "published " + std::to_string(published) + " blocks (" + std::to_string(ids.size()) +
               " prefixes x " + std::to_string(o.blocks) + "), all in the index");

  // Leases held until the end (or the kill).
  std::vector<co::Lease> held;
  for (std::uint32_t p : Expand(ParseRanges(o.hold))) {
    const auto keys = Keys(p, o.blocks);
    std::vector<co::Lease> got;
    auto n = h.prefix->AcquireChain(kNs, keys, &got);
    for (int tries = 0; (!n.ok() || *n != keys.size()) && tries < 200; ++tries) {
      h.prefix->ReleaseAll(got);
      got.clear();
      h.Tick();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      n = h.prefix->AcquireChain(kNs, keys, &got);
    }
    if (!n.ok() || *n != keys.size()) {
      Fail(who + ": lease prefix " + std::to_string(p) + ": " +
           (n.ok() ? std::to_string(*n) + " of " + std::to_string(keys.size()) + " blocks"
                   : std::string(n.status().message())));
    }
    held.insert(held.end(), got.begin(), got.end());
  }
  if (!held.empty()) Log(who, "holds " + std::to_string(held.size()) + " leases");

  {
    const std::string tmp = o.ready + ".tmp";
    std::ofstream f(tmp);
    f << "host=" << o.host << "\nincarnation=" << h.client->incarnation() << "\nextent=" << extent
      << "\narena=" << Hex(uuid.data(), uuid.size()) << "\npublished=" << published
      << "\nleases=" << held.size() << "\n";
    f.close();
    if (!f || std::rename(tmp.c_str(), o.ready.c_str()) != 0) Fail("write " + o.ready);
  }

  // Serve: heartbeat the prefix domain, renew the held leases, free what the owner returns.
  std::uint64_t renewals = 0;
  while (!g_stop.load()) {
    h.Beat();
    for (const co::BlockRef& r : h.returned) {
      if (std::memcmp(r.arena, uuid.data(), 16) == 0) {
        (void)alloc->Free(BlockHandle{r.index, r.generation});
      }
    }
    h.returned.clear();
    for (co::Lease& l : held) {
      if (auto rs = h.prefix->Renew(l); !rs.ok()) {
        Fail(who + ": renew a lease: " + std::string(rs.message()));
      }
      ++renewals;
    }
    if (revoked->load())
      Fail(who + ": extent " + std::to_string(extent) + " was revoked while serving");
    if (h.client->rejoins() != 0) Fail(who + ": fenced by the orchestrator while serving");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }

  // Stop: leases released, the arena closed, the extent given back, then leave.
  h.prefix->ReleaseAll(held);
  if (h.prefix->leases_held() != 0) Fail(who + ": leases still held after ReleaseAll");
  alloc.reset();
  if (auto st = pooled.Shrink(extent); !st.ok()) {
    if (!Transient(st)) {
      Fail(who + ": give extent " + std::to_string(extent) + " back: " + std::string(st.message()));
    }
    Log(who, "give extent " + std::to_string(extent) + " back: " + std::string(st.message()) +
                 " (leaving returns it too)");
  }
  MustLeave(*h.client, who);
  Log(who, "stopped: released " + std::to_string(held.size()) + " leases (" +
               std::to_string(renewals) + " renewals), gave extent " + std::to_string(extent) +
               " back, left");
  return 0;
}

// ---- read and hold ------------------------------------------------------------------------

struct Tally {
  std::uint64_t leased = 0, verified = 0, discarded = 0, released = 0;
  std::vector<std::string> arenas;
};

// Copies block `b` of prefix `p` out of the block `l` names and compares every byte with what
// its publisher wrote. Returns false when the lease's validation after the copy fails (the
// copy must be discarded); a wrong byte under a valid lease fails the test.
bool CopyAndCheck(Host& h, orch::PooledArenas& pooled, const co::Lease& l, std::uint32_t p,
                  std::uint32_t b, const std::string& who, std::vector<std::byte>& copy,
                  std::vector<std::byte>& want) {
  auto addr = Retry(who + ": resolve", [&] { return pooled.Resolve(l.ref); });
  if (!addr.ok()) {
    Fail(who + ": prefix " + std::to_string(p) + " block " + std::to_string(b) +
         ": leased but not allocated in its publisher's extent arena: " +
         std::string(addr.status().message()));
  }
  // Another host wrote it: read memory, not a stale line, then check the generation.
  if (!h.prefix->CopyOut(l, *addr, copy.data(), copy.size()).ok()) return false;
  Fill(want.data(), want.size(), l.ref.arena, p, b);
  if (std::memcmp(copy.data(), want.data(), copy.size()) != 0) {
    std::size_t at = 0;
    while (copy[at] == want[at]) ++at;
    Fail(who + ": prefix " + std::to_string(p) + " block " + std::to_string(b) + " (arena " +
         Hex(l.ref.arena, 16) + " index " + std::to_string(l.ref.index) +
         "): wrong byte at offset " + std::to_string(at) + " of " + std::to_string(copy.size()));
  }
  return true;
}

// Leases every block of prefix `p` and checks each (retrying while it is not published yet
// or a validation fails); returns the leases, still held.
std::vector<co::Lease> TakeVerified(Host& h, orch::PooledArenas& pooled, std::uint32_t p,
                                    std::uint32_t blocks, Clock::time_point deadline,
                                    const std::string& who, Tally& t) {
  const auto keys = Keys(p, blocks);
  std::vector<std::byte> copy(kLayout.BlockBytes()), want(kLayout.BlockBytes());
  for (;;) {
    std::vector<co::Lease> leases;
    auto n = h.prefix->AcquireChain(kNs, keys, &leases);
    bool done = n.ok() && *n == keys.size();
    if (done) {
      t.leased += leases.size();
      for (std::uint32_t b = 0; b < leases.size() && done; ++b) {
        h.Tick();
        if (!CopyAndCheck(h, pooled, leases[b], p, b, who, copy, want)) {
          ++t.discarded;  // the lease ended or the entry was retired during the copy
          done = false;
          break;
        }
        ++t.verified;
        const std::string a = Hex(leases[b].ref.arena, 16);
        if (std::find(t.arenas.begin(), t.arenas.end(), a) == t.arenas.end()) t.arenas.push_back(a);
      }
    }
    if (done) return leases;
    const std::size_t before = h.prefix->leases_held();
    h.prefix->ReleaseAll(leases);
    t.released += before - h.prefix->leases_held();
    if (Clock::now() > deadline) {
      Fail(who + ": prefix " + std::to_string(p) + ": " +
           (n.ok() ? std::to_string(*n) + " of " + std::to_string(keys.size()) + " blocks published"
                   : std::string(n.status().message())) +
           " when the time was up");
    }
    h.Tick();  // not published yet, or no acknowledged beat
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string Arenas(const Tally& t) {
  std::string s;
  for (const std::string& a : t.arenas) s += (s.empty() ? "" : ", ") + a;
  return s;
}

struct ReadOptions {
  std::string endpoint, prefixes, ready;
  std::uint32_t host = 1, blocks = 8;
  double timeout_s = 60;
};

int Read(const ReadOptions& o) {
  const std::string who = "host " + std::to_string(o.host);
  Host h;
  Join(h, o.endpoint, o.host);
  orch::PooledArenas pooled(*h.client);
  Tally t;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(o.timeout_s));
  for (std::uint32_t p : Expand(ParseRanges(o.prefixes))) {
    std::vector<co::Lease> leases = TakeVerified(h, pooled, p, o.blocks, deadline, who, t);
    const std::size_t before = h.prefix->leases_held();
    h.prefix->ReleaseAll(leases);
    t.released += before - h.prefix->leases_held();
  }
  if (h.prefix->leases_held() != 0) {
    Fail(who + ": " + std::to_string(h.prefix->leases_held()) + " leases still held");
  }
  if (h.client->rejoins() != 0) Fail(who + ": fenced by the orchestrator while reading");
  MustLeave(*h.client, who);
  std::printf(
      "%s: verified %llu blocks (%llu KiB, every byte) from %zu arenas [%s] in %.1f s; "
      "%llu leases taken, %llu released, %llu copies discarded by validation; left\n",
      who.c_str(), static_cast<unsigned long long>(t.verified),
      static_cast<unsigned long long>(t.verified * kLayout.BlockBytes() / 1024), t.arenas.size(),
      Arenas(t).c_str(), std::chrono::duration<double>(Clock::now() - start).count(),
      static_cast<unsigned long long>(t.leased), static_cast<unsigned long long>(t.released),
      static_cast<unsigned long long>(t.discarded));
  return 0;
}

// Leases and checks the prefixes, writes `ready`, keeps the leases (renewing them) until
// SIGTERM, then copies every block again: its bytes must be unchanged (the memory under a
// held lease is never lent again, even when its publisher died), and the validation tells
// whether the entry was retired meanwhile (its arena revoked). Releases and leaves.
int Hold(const ReadOptions& o) {
  const std::string who = "host " + std::to_string(o.host);
  Host h;
  Join(h, o.endpoint, o.host);
  orch::PooledArenas pooled(*h.client);
  Tally t;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(o.timeout_s));
  struct Held {
    std::uint32_t p = 0, b = 0;
    co::Lease lease;
  };
  std::vector<Held> held;
  for (std::uint32_t p : Expand(ParseRanges(o.prefixes))) {
    const auto leases = TakeVerified(h, pooled, p, o.blocks, deadline, who, t);
    for (std::uint32_t b = 0; b < leases.size(); ++b) held.push_back(Held{p, b, leases[b]});
  }
  {
    std::ofstream f(o.ready + ".tmp");
    f << "host=" << o.host << "\nleases=" << held.size() << "\n";
    f.close();
    if (!f || std::rename((o.ready + ".tmp").c_str(), o.ready.c_str()) != 0)
      Fail("write " + o.ready);
  }
  Log(who, "holds " + std::to_string(held.size()) + " leases on verified blocks of arenas [" +
               Arenas(t) + "]");
  std::uint64_t renewals = 0;
  while (!g_stop.load()) {
    h.Beat();
    for (Held& x : held) {
      if (auto st = h.prefix->Renew(x.lease); !st.ok()) {
        Fail(who + ": renew the lease on prefix " + std::to_string(x.p) + " block " +
             std::to_string(x.b) + ": " + std::string(st.message()));
      }
      ++renewals;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  // The bytes under the leases, once more.
  std::uint32_t intact = 0, retired = 0;
  std::vector<std::byte> copy(kLayout.BlockBytes()), want(kLayout.BlockBytes());
  for (const Held& x : held) {
    auto addr = Retry(who + ": resolve", [&] { return pooled.Resolve(x.lease.ref); });
    if (!addr.ok()) {
      Fail(who + ": prefix " + std::to_string(x.p) + " block " + std::to_string(x.b) +
           " under a held lease no longer resolves: " + std::string(addr.status().message()));
    }
    const absl::Status v = h.prefix->CopyOut(x.lease, *addr, copy.data(), copy.size());
    if (absl::IsAborted(v)) {
      ++retired;
    } else if (!v.ok()) {
      Fail(who + ": validate prefix " + std::to_string(x.p) + " block " + std::to_string(x.b) +
           ": " + std::string(v.message()));
    }
    Fill(want.data(), want.size(), x.lease.ref.arena, x.p, x.b);
    intact += std::memcmp(copy.data(), want.data(), copy.size()) == 0;
  }
  std::vector<co::Lease> leases;
  for (const Held& x : held) leases.push_back(x.lease);
  h.prefix->ReleaseAll(leases);
  if (h.prefix->leases_held() != 0) Fail(who + ": leases still held after ReleaseAll");
  if (h.client->rejoins() != 0) Fail(who + ": fenced by the orchestrator while holding");
  MustLeave(*h.client, who);
  std::printf(
      "%s: held %zu leases for %.1f s (%llu renewals); at the end %u of %zu blocks intact, "
      "%u of them retired meanwhile; released all, left\n",
      who.c_str(), held.size(), secs, static_cast<unsigned long long>(renewals), intact,
      held.size(), retired);
  if (intact != held.size()) Fail(who + ": a block changed under a held lease");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"cxlkv-guest-lease: one host of the lease protocol in the two-host QEMU guests"};
  app.require_subcommand(1);
  ServeOptions so;
  CLI::App* serve = app.add_subcommand("serve", "publish prefixes from an extent and serve them");
  serve->add_option("--endpoint", so.endpoint, "the orchestrator: a Unix socket or tcp:HOST:PORT")
      ->required();
  serve->add_option("--host", so.host, "host id")->required();
  serve->add_option("--prefixes", so.prefixes, "prefixes to publish, FIRST:COUNT[,...]")
      ->required();
  serve->add_option("--blocks", so.blocks, "blocks per prefix")->check(CLI::Range(1, 64));
  serve->add_option("--hold", so.hold, "prefixes to lease and keep leased, FIRST:COUNT[,...]");
  serve->add_option("--ready", so.ready, "written once everything is published and leased")
      ->required();
  ReadOptions ro;
  CLI::App* read = app.add_subcommand("read", "lease, copy and check every block of prefixes");
  read->add_option("--endpoint", ro.endpoint, "the orchestrator: a Unix socket or tcp:HOST:PORT")
      ->required();
  read->add_option("--host", ro.host, "host id")->required();
  read->add_option("--prefixes", ro.prefixes, "prefixes to read, FIRST:COUNT[,...]")->required();
  read->add_option("--blocks", ro.blocks, "blocks per prefix")->check(CLI::Range(1, 64));
  read->add_option("--timeout", ro.timeout_s, "seconds to wait for unpublished prefixes");
  CLI::App* hold =
      app.add_subcommand("hold", "lease and check prefixes, hold the leases until SIGTERM");
  hold->add_option("--endpoint", ro.endpoint, "the orchestrator: a Unix socket or tcp:HOST:PORT")
      ->required();
  hold->add_option("--host", ro.host, "host id")->required();
  hold->add_option("--prefixes", ro.prefixes, "prefixes to lease, FIRST:COUNT[,...]")->required();
  hold->add_option("--blocks", ro.blocks, "blocks per prefix")->check(CLI::Range(1, 64));
  hold->add_option("--timeout", ro.timeout_s, "seconds to wait for unpublished prefixes");
  hold->add_option("--ready", ro.ready, "written once every lease is held")->required();
  CLI11_PARSE(app, argc, argv);

  struct sigaction sa {};
  sa.sa_handler = [](int) { g_stop.store(true); };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (serve->parsed()) return Serve(so);
  return hold->parsed() ? Hold(ro) : Read(ro);
}
