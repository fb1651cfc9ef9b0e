// cxlkv-guest-pool: arena tests that run inside the QEMU CXL guests on a real /dev/daxX.Y.
//
//   cxlkv-guest-pool devdax SPEC          format, allocate, copy, verify, two processes, kill -9
//   cxlkv-guest-pool publish SPEC N       host A: format, write N blocks, persist them
//   cxlkv-guest-pool consume SPEC N SECS  host B: wait for A's arena, resolve and verify its
//                                         N persisted blocks by BlockRef, read-only
// Exits 0 on success; every failure prints "FAIL: <what>" and exits 1. Data volumes stay
// small: CXL memory is emulated as MMIO under TCG (tens of MiB/s).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cxlkv/allocator/block_allocator.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"

namespace {

using cxlkv::allocator::BlockAllocator;
using cxlkv::allocator::BlockHandle;
using cxlkv::allocator::FreeResult;
namespace pool = cxlkv::pool;

[[noreturn]] void Fail(const std::string& what) {
  std::printf("FAIL: %s\n", what.c_str());
  std::fflush(stdout);
  std::exit(1);
}

void Check(bool ok, const std::string& what) {
  if (!ok) Fail(what);
}

template <typename T>
T Must(absl::StatusOr<T> v, const std::string& what) {
  if (!v.ok()) Fail(what + ": " + std::string(v.status().message()));
  return std::move(*v);
}

// 4 KiB blocks (class 0) and 64 KiB blocks (class 1).
pool::FormatOptions GuestOptions() {
  pool::FormatOptions o;
  o.layout = pool::KvLayout{1, 1, 64, 2, 16, pool::KvLayoutKind::kContiguous};
  o.classes = {{16, 0, 1}, {256, 0, 1}};
  o.owner_slots = 16;
  o.force = true;
  return o;
}

// The content a block of (index, generation) carries, word by word.
std::uint64_t Pattern(std::uint32_t index, std::uint32_t gen, std::size_t word) {
  return ((std::uint64_t{index} << 32) | gen) ^ (word * 0x9E3779B97F4A7C15ull);
}

void Fill(std::byte* block, std::uint32_t index, std::uint32_t gen, std::size_t bytes) {
  std::vector<std::uint64_t> buf(bytes / 8);
  for (std::size_t w = 0; w < buf.size(); ++w) buf[w] = Pattern(index, gen, w);
  cxlkv::coherence::CopyNt(block, buf.data(), bytes);
}

bool Verify(const std::byte* block, std::uint32_t index, std::uint32_t gen, std::size_t bytes) {
  const auto* w = reinterpret_cast<const std::uint64_t*>(block);
  for (std::size_t i = 0; i < bytes / 8; ++i) {
    if (w[i] != Pattern(index, gen, i)) return false;
  }
  return true;
}

std::unique_ptr<BlockAllocator> OpenAllocator(const std::string& spec) {
  auto arena = Must(pool::Arena::Open(Must(pool::OpenRegion(spec), "open " + spec)), "arena open");
  return Must(BlockAllocator::Create(std::move(arena)), "allocator");
}

int Devdax(const std::string& spec) {
  auto region = Must(pool::OpenRegion(spec), "open " + spec);
  std::printf("region %s: %llu bytes, alignment %llu\n", region->name().c_str(),
              static_cast<unsigned long long>(region->size_bytes()),
              static_cast<unsigned long long>(region->alignment()));
  Check(region->alignment() >= 4096, "device alignment from libdaxctl");
  Check(reinterpret_cast<std::uintptr_t>(region->addr()) % region->alignment() == 0,
        "mapping honours the device alignment");
  auto a = Must(BlockAllocator::Create(
                    Must(pool::Arena::Format(std::move(region), GuestOptions()), "format")),
                "allocator");
  std::printf("formatted arena %s: %u + %u blocks\n", pool::UuidToString(a->arena().uuid()).c_str(),
              a->arena().class_record(0).block_count, a->arena().class_record(1).block_count);

  // Write, read back, free; misuse is detected.
  std::vector<BlockHandle> hs;
  for (int i = 0; i < 48; ++i) {
    const BlockHandle h = a->Alloc(static_cast<std::uint32_t>(i % 2));
    Check(h.valid(), "alloc");
    Fill(a->Addr(h), h.index, h.generation, 4096);
    hs.push_back(h);
  }
  for (const BlockHandle& h : hs) {
    Check(Verify(a->Addr(h), h.index, h.generation, 4096), "data read back from /dev/dax");
    Check(Must(a->Resolve(a->Ref(h)), "resolve") == a->Addr(h), "ref resolves");
  }
  Check(a->FreeBulk(hs.data(), hs.size()) == hs.size(), "free");
  Check(a->Free(hs[0]) == FreeResult::kDoubleFree, "double free detected");
  std::vector<BlockHandle> bulk(100);
  Check(a->AllocBulk(0, bulk.size(), bulk.data()), "bulk alloc");
  Check(a->FreeBulk(bulk.data(), bulk.size()) == bulk.size(), "bulk free");

  // Two processes at once, each checking that nobody else writes into its blocks.
  std::vector<pid_t> pids;
  for (int p = 0; p < 2; ++p) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      auto mine = OpenAllocator(spec);
      const std::uint64_t tag = 0xABCD000000000000ull | static_cast<std::uint64_t>(::getpid());
      std::vector<BlockHandle> held;
      for (int i = 0; i < 3000; ++i) {
        if (held.size() < 16 && i % 3 != 2) {
          const BlockHandle h = mine->Alloc(0);
          if (!h.valid()) continue;
          std::memcpy(mine->Addr(h), &tag, sizeof(tag));
          held.push_back(h);
        } else if (!held.empty()) {
          std::uint64_t seen;
          std::memcpy(&seen, mine->Addr(held.back()), sizeof(seen));
          if (seen != tag) ::_exit(2);
          if (mine->Free(held.back()) != FreeResult::kOk) ::_exit(3);
          held.pop_back();
        }
      }
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    Check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "two processes on one devdax arena");
  }

  // kill -9 in the middle of allocating: the next opener gets everything back.
  // The victim says when it has attached and allocated: under TCG on a busy machine a fixed
  // delay may end before it did, and the recovery below would then find no dead owner of it.
  int attached[2];
  Check(::pipe(attached) == 0, "pipe");
  const pid_t victim = ::fork();
  if (victim == 0) {
    auto mine = OpenAllocator(spec);
    bool told = false;
    for (;;) {
      const BlockHandle h = mine->Alloc(1);
      if (!told && h.valid()) told = ::write(attached[1], "x", 1) == 1;
      if (h.valid() && h.index % 3 == 0) (void)mine->Free(h);
    }
  }
  ::close(attached[1]);
  char byte = 0;
  Check(::read(attached[0], &byte, 1) == 1, "the victim attached and allocated");
  ::close(attached[0]);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // in the middle of allocating
  ::kill(victim, SIGKILL);
  ::waitpid(victim, nullptr, 0);
  const pool::RecoveryReport rec = a->arena().Recover();
  const pool::ArenaUsage u = a->arena().Usage();
  std::printf("after kill -9: %u owners and %u blocks reclaimed\n", rec.owners_reclaimed,
              rec.blocks_reclaimed);
  Check(rec.owners_reclaimed == 1, "the killed owner was found dead");
  a->FlushThreadCache();
  const pool::ArenaUsage after = a->arena().Usage();
  for (const pool::ClassUsage& c : after.classes) {
    Check(c.free == c.total, "every block free again after recovery");
  }
  (void)u;
  Check(pool::ValidateMap(a->arena().header(), a->arena().region().addr(), spec).ok(), "map valid");
  std::printf("devdax: OK\n");
  return 0;
}

int Publish(const std::string& spec, std::uint32_t n) {
  auto a = Must(
      BlockAllocator::Create(Must(
          pool::Arena::Format(Must(pool::OpenRegion(spec), "open"), GuestOptions()), "format")),
      "allocator");
  for (std::uint32_t i = 0; i < n; ++i) {
    const BlockHandle h = a->Alloc(0);
    Check(h.valid(), "alloc");
    Fill(a->Addr(h), h.index, h.generation, 4096);  // streaming stores: in memory on return
    Check(a->Persist(h).ok(), "persist");
    std::printf("published %s/%u/%u\n", pool::UuidToString(a->arena().uuid()).c_str(), h.index,
                h.generation);
  }
  // The map words another host reads: write them back to the media too.
  cxlkv::coherence::Flush(a->arena().words(), a->arena().total_blocks() * sizeof(std::uint64_t));
  cxlkv::coherence::Fence();
  std::printf("publish: OK (%u blocks of arena %s)\n", n,
              pool::UuidToString(a->arena().uuid()).c_str());
  std::fflush(stdout);
  // Persisted blocks outlive this process; release the allocator so nothing else stays held.
  return 0;
}

int Consume(const std::string& spec, std::uint32_t n, int seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  std::string last = "nothing yet";
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto region = pool::OpenRegion(spec);
    if (!region.ok()) {
      last = std::string(region.status().message());
      continue;
    }
    // Another host writes this memory: drop cached lines of the metadata before reading.
    cxlkv::coherence::Invalidate((*region)->addr(), 1 << 20);
    pool::OpenOptions ro;
    ro.read_only = true;
    auto arena = pool::Arena::Open(std::move(*region), ro);
    if (!arena.ok()) {
      last = std::string(arena.status().message());
      continue;
    }
    pool::Arena& a = **arena;
    std::vector<std::pair<std::uint32_t, std::uint32_t>> refs;
    for (std::uint32_t i = 0; i < a.total_blocks(); ++i) {
      const std::uint64_t w = a.word(i).load();
      if (pool::WordState(w) == pool::kAllocated && pool::WordOwner(w) == 0) {
        refs.emplace_back(i, pool::WordGen(w));
      }
    }
    if (refs.size() < n) {
      last = std::to_string(refs.size()) + " of " + std::to_string(n) + " blocks published";
      continue;
    }
    for (const auto& [index, gen] : refs) {
      std::byte* p = Must(a.Resolve(a.uuid(), index, gen), "resolve published ref");
      cxlkv::coherence::Invalidate(p, 4096);
      Check(Verify(p, index, gen, 4096),
            "content of block " + std::to_string(index) + " as published by the other host");
      // Generation checked again after the copy-out: the block was not reclaimed meanwhile.
      Check(pool::WordGen(a.word(index).load()) == gen, "generation unchanged after reading");
    }
    std::printf("consume: OK (%zu blocks of arena %s read by ref)\n", refs.size(),
                pool::UuidToString(a.uuid()).c_str());
    return 0;
  }
  Fail("no arena with " + std::to_string(n) + " published blocks within " +
       std::to_string(seconds) + " s (" + last + ")");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "devdax" && argc == 3) return Devdax(argv[2]);
  if (mode == "publish" && argc == 4)
    return Publish(argv[2], static_cast<std::uint32_t>(std::atoi(argv[3])));
  if (mode == "consume" && argc == 5) {
    return Consume(argv[2], static_cast<std::uint32_t>(std::atoi(argv[3])), std::atoi(argv[4]));
  }
  std::fprintf(stderr, "usage: %s devdax SPEC | publish SPEC N | consume SPEC N SECONDS\n",
               argv[0]);
  return 2;
}
