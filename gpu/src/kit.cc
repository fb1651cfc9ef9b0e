// The GPU kit's planning and reporting (kit.h): no CUDA here.
#include "cxlkv/gpu/kit.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cxlkv/base/bytes.h"
#include "cxlkv/base/file.h"
#include "nlohmann/json.hpp"

namespace cxlkv::gpu {
namespace {

constexpr std::uint64_t kKiB = 1ull << 10, kMiB = 1ull << 20, kGiB = 1ull << 30;
constexpr std::uint64_t kCopyChunks[] = {64 * kKiB, 256 * kKiB, 2 * kMiB,   8 * kMiB,
                                         32 * kMiB, 128 * kMiB, 512 * kMiB, kGiB};
constexpr std::uint64_t kMaxBatch = kGiB, kMinBatch = 256 * kMiB;
constexpr std::uint64_t kRegisterGiB[] = {8, 64, 256};
constexpr std::uint64_t kTrafficGiB = 8;
// Left free beside what the kit maps, so the box does not swap or kill the run.
constexpr std::uint64_t kHostHeadroom = 8 * kGiB;
constexpr std::uint32_t kStreamLoads[] = {1, 2, 4, 8};
constexpr std::uint32_t kWriteBackBlocks = 16;
constexpr std::uint64_t kWriteBackBlockBytes = 8 * kMiB;

// The planner's estimates, pessimistic so the run ends inside its budget: a Google Benchmark
// case at --benchmark_min_time=0.1 runs its function at least twice (one estimating run) with
// the fixture warm; copies at a PCIe Gen4 x16's worst useful rate; registration at the costs
// measured on an H200 host (docs/gpu.md: 0.41-0.65 s/GiB when the driver faults the pages in)
// plus unregistering and freeing the memfd.
constexpr double kCaseFloorS = 0.35;
constexpr double kPinnedCopyBps = 10e9, kPageableCopyBps = 4e9;
constexpr double kReleaseSPerGiB = 0.1;

double RegisterSPerGiB(absl::string_view mode) {
  if (mode == "chunked") return 0.2;
  if (mode == "prefault+one-call") return 0.25;
  return 0.7;  // one-call: the driver faults every page in on one thread
}

std::string SizeName(std::uint64_t b) {
  if (b >= kGiB && b % kGiB == 0) return absl::StrCat(b / kGiB, "GiB");
  if (b >= kMiB && b % kMiB == 0) return absl::StrCat(b / kMiB, "MiB");
  if (b >= kKiB && b % kKiB == 0) return absl::StrCat(b / kKiB, "KiB");
  return absl::StrCat(b, "B");
}

std::string Gib(std::uint64_t b) {
  return absl::StrFormat("%.1f GiB", static_cast<double>(b) / static_cast<double>(kGiB));
}

// "Node 0 MemFree:   123456 kB" -> bytes, from a node's meminfo; 0 when absent.
std::uint64_t MeminfoField(absl::string_view text, absl::string_view field) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const std::size_t at = line.find(field);
    if (at == absl::string_view::npos) continue;
    absl::string_view rest = absl::StripAsciiWhitespace(line.substr(at + field.size()));
    absl::ConsumeSuffix(&rest, "kB");
    std::uint64_t kb = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kb)) return kb * kKiB;
  }
  return 0;
}

void Skip(KitCase& c, std::string why) {
  if (c.skipped.empty()) c.skipped = std::move(why);
}

}  // namespace

const char* KitGroupName(KitGroup g) {
  switch (g) {
    case KitGroup::kCopy:
      return "copy";
    case KitGroup::kGather:
      return "gather";
    case KitGroup::kStreams:
      return "streams";
    case KitGroup::kWriteBack:
      return "write-back";
    case KitGroup::kRegister:
      return "register";
    case KitGroup::kRegisterUnderTraffic:
      return "register-under-traffic";
  }
  return "?";
}

KitMachine ReadHostMachine() {
  KitMachine m;
  if (auto t = base::ReadFile("/proc/meminfo", 1 << 20); t.ok()) {
    m.host_available_bytes = MeminfoField(*t, "MemAvailable:");
  }
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  m.host_cpus = cpus > 0 ? static_cast<unsigned>(cpus) : 1;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/sys/devices/system/node", ec)) {
    const std::string name = e.path().filename().string();
    int node = -1;
    if (!absl::StartsWith(name, "node") || !absl::SimpleAtoi(name.substr(4), &node)) continue;
    auto t = base::ReadFile(e.path().string() + "/meminfo", 1 << 20);
    if (!t.ok() || MeminfoField(*t, "MemTotal:") == 0) continue;
    m.numa_nodes.emplace_back(node, MeminfoField(*t, "MemFree:"));
  }
  std::sort(m.numa_nodes.begin(), m.numa_nodes.end());
  return m;
}

int NumaNodeOfPciDevice(absl::string_view bus_id) {
  auto t = base::ReadFile(
      absl::StrCat("/sys/bus/pci/devices/", absl::AsciiStrToLower(bus_id), "/numa_node"), 64);
  int node = -1;
  if (!t.ok() || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*t), &node)) return -1;
  return node;
}

absl::StatusOr<KitMachine> ParseKitMachine(absl::string_view spec) {
  constexpr absl::string_view kForm =
      "device_free_gib=N,host_gib=N[,cpus=N][,gpu_node=N][,nodes=NODE:GIB/NODE:GIB][,name=TEXT]";
  auto bad = [&](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kit_machine '", spec, "': ", what, "; the form is ", kForm));
  };
  auto gib = [](absl::string_view v, std::uint64_t* out) {
    double g = 0;
    if (!absl::SimpleAtod(v, &g) || g < 0 || g > 1e6) return false;
    *out = static_cast<std::uint64_t>(g * static_cast<double>(kGiB));
    return true;
  };
  KitMachine m;
  bool have_device = false, have_host = false;
  for (absl::string_view item : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv =
        absl::StrSplit(item, absl::MaxSplits('=', 1));
    const absl::string_view k = kv.first, v = kv.second;
    if (k == "device_free_gib") {
      if (!gib(v, &m.device_free_bytes))
        return bad(absl::StrCat("device_free_gib '", v, "' is not a size in GiB"));
      have_device = true;
    } else if (k == "host_gib") {
      if (!gib(v, &m.host_available_bytes))
        return bad(absl::StrCat("host_gib '", v, "' is not a size in GiB"));
      have_host = true;
    } else if (k == "cpus") {
      if (!absl::SimpleAtoi(v, &m.host_cpus) || m.host_cpus == 0)
        return bad(absl::StrCat("cpus '", v, "' is not a positive count"));
    } else if (k == "gpu_node") {
      if (!absl::SimpleAtoi(v, &m.gpu_numa_node) || m.gpu_numa_node < -1)
        return bad(absl::StrCat("gpu_node '", v, "' is not a node number"));
    } else if (k == "nodes") {
      for (absl::string_view n : absl::StrSplit(v, '/', absl::SkipEmpty())) {
        std::pair<absl::string_view, absl::string_view> nf =
            absl::StrSplit(n, absl::MaxSplits(':', 1));
        int node = -1;
        std::uint64_t free_bytes = 0;
        if (!absl::SimpleAtoi(nf.first, &node) || node < 0 || !gib(nf.second, &free_bytes)) {
          return bad(absl::StrCat("nodes entry '", n, "' is not NODE:FREE_GIB"));
        }
        m.numa_nodes.emplace_back(node, free_bytes);
      }
    } else if (k == "name") {
      m.device_name = std::string(v);
    } else {
      return bad(absl::StrCat("unknown key '", k, "'"));
    }
  }
  if (!have_device || !have_host) return bad("device_free_gib and host_gib are required");
  if (m.host_cpus == 0) m.host_cpus = 1;
  if (m.numa_nodes.empty()) m.numa_nodes.emplace_back(0, m.host_available_bytes);
  std::sort(m.numa_nodes.begin(), m.numa_nodes.end());
  return m;
}

double KitPlan::planned_s() const {
  double s = 0;
  for (const KitCase& c : cases) {
    if (c.skipped.empty()) s += c.est_s;
  }
  return s;
}

const KitCase* KitPlan::Find(absl::string_view name) const {
  for (const KitCase& c : cases) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

KitPlan PlanKit(const KitMachine& m, const KitOptions& o) {
  KitPlan p;
  p.machine = m;
  p.budget_s = o.budget_s;

  // The copy batch: 1 GiB, halved until the device holds it twice over and the host holds
  // the four sources (cudaHostAlloc, arena, remote arena, pageable) beside 2 GiB.
  auto fits = [&](std::uint64_t b) {
    return b <= m.device_free_bytes / 2 && 4 * b + 2 * kGiB <= m.host_available_bytes;
  };
  std::uint64_t batch = kMaxBatch;
  while (batch > kMinBatch && !fits(batch)) batch /= 2;
  std::string no_copy;
  if (m.device_free_bytes == 0) {
    no_copy = "no CUDA device";
  } else if (!fits(batch)) {
    no_copy = absl::StrCat("the copy cases need ", SizeName(2 * kMinBatch), " of free HBM and ",
                           Gib(4 * kMinBatch + 2 * kGiB), " of host memory; the device has ",
                           Gib(m.device_free_bytes), " free, the host ",
                           Gib(m.host_available_bytes), " available");
  } else {
    p.copy_batch_bytes = batch;
  }

  // The remote source: the node with the most free memory other than the GPU's.
  std::string no_remote;
  if (m.numa_nodes.size() < 2) {
    no_remote = "this box has one NUMA node with memory";
  } else if (m.gpu_numa_node < 0) {
    no_remote = "the GPU's NUMA node is not known (the kernel reports -1)";
  } else {
    std::pair<int, std::uint64_t> best{-1, 0};
    for (const auto& n : m.numa_nodes) {
      if (n.first != m.gpu_numa_node && n.second > best.second) best = n;
    }
    if (best.first < 0) {
      no_remote =
          absl::StrCat("no NUMA node with memory besides the GPU's (", m.gpu_numa_node, ")");
    } else if (best.second < batch + kGiB) {
      no_remote = absl::StrCat("node ", best.first, " has ", Gib(best.second),
                               " free; the remote source needs ", Gib(batch + kGiB));
    } else {
      p.remote_node = best.first;
    }
  }

  const auto copy_est = [&](bool pageable) {
    return kCaseFloorS +
           3.0 * static_cast<double>(batch) / (pageable ? kPageableCopyBps : kPinnedCopyBps);
  };
  // 1. Copies: H2D first (what serving waits for), every source per chunk size.
  for (const bool h2d : {true, false}) {
    for (const std::uint64_t chunk : kCopyChunks) {
      for (const char* src : {"hostalloc", "arena", "remote", "pageable"}) {
        KitCase c;
        c.group = KitGroup::kCopy;
        c.source = src;
        c.h2d = h2d;
        c.bytes = chunk;
        c.name = absl::StrCat("Copy/", h2d ? "h2d" : "d2h", "/", src, "/", SizeName(chunk));
        c.est_s = copy_est(c.source == "pageable");
        if (!no_copy.empty()) Skip(c, no_copy);
        if (c.source == "remote" && !no_remote.empty()) Skip(c, no_remote);
        if (chunk > batch) {
          Skip(c, absl::StrCat("chunk above the ", SizeName(batch),
                               " batch the device's free memory and the host's allow"));
        }
        p.cases.push_back(std::move(c));
      }
    }
  }
  // Concurrent loads: n loads of batch/8 each, one stream each.
  for (const char* src : {"arena", "hostalloc"}) {
    for (const std::uint32_t n : kStreamLoads) {
      KitCase c;
      c.group = KitGroup::kStreams;
      c.source = src;
      c.bytes = batch / 8;
      c.count = n;
      c.name = absl::StrCat("Streams/", src, "/", n);
      c.est_s = kCaseFloorS + 3.0 * static_cast<double>(n * c.bytes) / kPinnedCopyBps;
      if (!no_copy.empty()) Skip(c, no_copy);
      p.cases.push_back(std::move(c));
    }
  }
  // 3. The write-back: blocks D2H into an arena on a /dev/shm file, read through a second
  // mapping.
  {
    KitCase c;
    c.group = KitGroup::kWriteBack;
    c.source = "arena";
    c.h2d = false;
    c.bytes = kWriteBackBlockBytes;
    c.count = kWriteBackBlocks;
    c.name = absl::StrCat("WriteBack/", kWriteBackBlocks, "x", SizeName(kWriteBackBlockBytes));
    c.est_s = 1.0;
    if (!no_copy.empty()) Skip(c, no_copy);
    p.cases.push_back(std::move(c));
  }

  // 2. Registration. The host must hold the region beside the copy fixtures and a headroom.
  const std::uint64_t fixtures = p.copy_batch_bytes * 4;
  auto host_need = [&](std::uint64_t bytes) { return bytes + fixtures + kHostHeadroom; };
  std::uint64_t traffic = kTrafficGiB * kGiB;
  while (traffic > kGiB && host_need(traffic) > m.host_available_bytes) traffic /= 2;
  {
    KitCase c;
    c.group = KitGroup::kRegisterUnderTraffic;
    c.source = "chunked";
    c.bytes = traffic;
    c.name = absl::StrCat("RegisterUnderTraffic/", SizeName(traffic));
    c.est_s = 1.5 + static_cast<double>(traffic) / static_cast<double>(kGiB) *
                        (RegisterSPerGiB("chunked") + kReleaseSPerGiB);
    if (!no_copy.empty()) Skip(c, no_copy);
    if (host_need(traffic) > m.host_available_bytes) {
      Skip(c, absl::StrCat("needs ", Gib(host_need(traffic)), " of host memory; the host has ",
                           Gib(m.host_available_bytes), " available"));
    }
    p.cases.push_back(std::move(c));
  }
  auto add_register = [&](std::uint64_t gib) {
    for (const char* mode : {"chunked", "prefault+one-call", "one-call"}) {
      KitCase c;
      c.group = KitGroup::kRegister;
      c.source = mode;
      c.bytes = gib * kGiB;
      c.name = absl::StrCat("Register/", mode, "/", SizeName(c.bytes));
      c.est_s = kCaseFloorS + static_cast<double>(gib) * (RegisterSPerGiB(mode) + kReleaseSPerGiB);
      if (m.device_free_bytes == 0) Skip(c, "no CUDA device");
      if (host_need(c.bytes) > m.host_available_bytes) {
        Skip(c,
             absl::StrCat("needs ", Gib(host_need(c.bytes)), " of host memory (the region, ",
                          Gib(fixtures), " of copy fixtures, ", Gib(kHostHeadroom),
                          " headroom); the host has ", Gib(m.host_available_bytes), " available"));
      }
      p.cases.push_back(std::move(c));
    }
  };
  add_register(kRegisterGiB[0]);
  // The gather kernel against a cudaMemcpyAsync per piece, at fixed sizes (256 MiB of the
  // batch; the layout of docs/gpu.md "The copy engine").
  for (const bool kernel : {true, false}) {
    for (const bool separate : {false, true}) {
      const std::string how =
          absl::StrCat(kernel ? "kernel" : "memcpy", "/", separate ? "separate" : "contiguous");
      for (const std::uint64_t piece : {4 * kKiB, 16 * kKiB, 64 * kKiB, 256 * kKiB}) {
        KitCase c;
        c.group = KitGroup::kGather;
        c.source = how;
        c.bytes = piece;
        c.name = absl::StrCat("Gather/", how, "/", SizeName(piece));
        c.est_s = kCaseFloorS;
        if (!no_copy.empty()) Skip(c, no_copy);
        p.cases.push_back(std::move(c));
      }
      for (const std::uint32_t blocks : {64u, 256u, 1024u}) {
        KitCase c;
        c.group = KitGroup::kGather;
        c.source = how;
        c.bytes = 4 * kKiB;
        c.count = blocks;
        c.name = absl::StrCat("GatherBlocks64K/", how, "/", blocks);
        c.est_s = kCaseFloorS;
        if (!no_copy.empty()) Skip(c, no_copy);
        p.cases.push_back(std::move(c));
      }
    }
  }
  for (std::size_t i = 1; i < std::size(kRegisterGiB); ++i) add_register(kRegisterGiB[i]);

  // The budget, in run order: a case that would end past it is skipped, saying so.
  double t = 0;
  for (KitCase& c : p.cases) {
    if (!c.skipped.empty()) continue;
    if (t + c.est_s > o.budget_s) {
      Skip(c, absl::StrFormat(
                  "time budget: ~%.0f s of %.0f s planned before it, the case needs ~%.0f s", t,
                  o.budget_s, c.est_s));
      continue;
    }
    t += c.est_s;
  }
  return p;
}

std::vector<std::string> FormatKitPlan(const KitPlan& p) {
  const KitMachine& m = p.machine;
  std::vector<std::string> out;
  std::vector<std::string> nodes;
  for (const auto& n : m.numa_nodes)
    nodes.push_back(absl::StrCat(n.first, " (", Gib(n.second), " free)"));
  out.push_back(absl::StrCat(
      "kit plan: device ", m.device_name.empty() ? "?" : m.device_name, ", ",
      m.device_free_bytes == 0 ? std::string("none") : Gib(m.device_free_bytes) + " free",
      "; host ", Gib(m.host_available_bytes), " available, ", m.host_cpus, " CPUs, NUMA nodes ",
      absl::StrJoin(nodes, ", "), "; GPU on node ", m.gpu_numa_node));
  out.push_back(
      absl::StrCat("kit plan: copy batch ",
                   p.copy_batch_bytes == 0 ? std::string("none") : SizeName(p.copy_batch_bytes),
                   "; remote source ",
                   p.remote_node < 0 ? std::string("none") : absl::StrCat("node ", p.remote_node)));
  std::size_t run = 0;
  for (const KitCase& c : p.cases) {
    if (c.skipped.empty()) {
      ++run;
      out.push_back(absl::StrFormat("kit plan: run  %s (~%.1f s)", c.name, c.est_s));
    } else {
      out.push_back(absl::StrCat("kit plan: skip ", c.name, ": ", c.skipped));
    }
  }
  out.push_back(absl::StrFormat("kit plan: %d cases run (~%.0f s of the %.0f s budget), %d skipped",
                                run, p.planned_s(), p.budget_s, p.cases.size() - run));
  return out;
}

namespace {

const double* Value(const KitRecords& r, const std::string& name, const char* key) {
  auto it = r.find(name);
  if (it == r.end() || !it->second.error.empty()) return nullptr;
  auto v = it->second.values.find(key);
  return v == it->second.values.end() ? nullptr : &v->second;
}

std::string Verdict(bool met) { return met ? "met" : "NOT met"; }

}  // namespace

std::vector<std::string> KitSummary(const KitPlan& p, const KitRecords& r) {
  std::vector<std::string> out;
  // 1. Copies, by direction and chunk: the arena against cudaHostAlloc (goal >= 95 %).
  for (const bool h2d : {true, false}) {
    const char* dir = h2d ? "h2d" : "d2h";
    for (const std::uint64_t chunk : kCopyChunks) {
      auto name = [&](const char* src) {
        return absl::StrCat("Copy/", dir, "/", src, "/", SizeName(chunk));
      };
      const double* ref = Value(r, name("hostalloc"), "bytes_per_second");
      const double* arena = Value(r, name("arena"), "bytes_per_second");
      if (ref == nullptr || arena == nullptr || *ref <= 0) continue;
      std::string line = absl::StrFormat(
          "kit: copy %s %s: arena %.1f GB/s = %.1f %% of cudaHostAlloc (%.1f GB/s; goal >= 95 %%: "
          "%s)",
          dir, SizeName(chunk), *arena / 1e9, 100 * *arena / *ref, *ref / 1e9,
          Verdict(*arena >= 0.95 * *ref));
      if (const double* rem = Value(r, name("remote"), "bytes_per_second")) {
        absl::StrAppendFormat(&line, "; remote node %d %.1f GB/s (%.1f %%)", p.remote_node,
                              *rem / 1e9, 100 * *rem / *ref);
      }
      if (const double* pg = Value(r, name("pageable"), "bytes_per_second")) {
        absl::StrAppendFormat(&line, "; pageable %.1f GB/s", *pg / 1e9);
      }
      out.push_back(std::move(line));
    }
  }
  // Concurrent loads: the aggregate rate of n loads against one load.
  for (const char* src : {"arena", "hostalloc"}) {
    const double* one = Value(r, absl::StrCat("Streams/", src, "/1"), "bytes_per_second");
    if (one == nullptr || *one <= 0) continue;
    std::vector<std::string> parts;
    double last = 0;
    std::uint32_t last_n = 1;
    for (const std::uint32_t n : kStreamLoads) {
      if (const double* v = Value(r, absl::StrCat("Streams/", src, "/", n), "bytes_per_second")) {
        parts.push_back(absl::StrFormat("%d: %.1f GB/s", n, *v / 1e9));
        last = *v;
        last_n = n;
      }
    }
    out.push_back(
        absl::StrFormat("kit: concurrent loads from %s (%s each, one stream each): %s; %d loads "
                        "together = %.2f x one "
                        "load (adds up to the link: %s)",
                        src, SizeName(p.copy_batch_bytes / 8), absl::StrJoin(parts, ", "), last_n,
                        last / *one, Verdict(last >= 0.95 * *one)));
  }
  // 3. The write-back.
  for (const KitCase& c : p.cases) {
    if (c.group != KitGroup::kWriteBack) continue;
    const double* matched = Value(r, c.name, "matched");
    const double* blocks = Value(r, c.name, "blocks");
    if (matched == nullptr || blocks == nullptr) continue;
    out.push_back(absl::StrFormat(
        "kit: write-back: %.0f blocks of %s copied D2H into the arena, persisted, read through a "
        "second mapping: %.0f of %.0f hold the device's bytes (%s)",
        *blocks, SizeName(c.bytes), *matched, *blocks,
        *matched == *blocks ? "safe to publish" : "NOT SAFE"));
  }
  // 2. Registration, by size: goal <= 0.03 s/GiB as shipped.
  for (const std::uint64_t gib : kRegisterGiB) {
    const std::string size = SizeName(gib * kGiB);
    const double* chunked = Value(r, absl::StrCat("Register/chunked/", size), "s_per_GiB");
    if (chunked == nullptr) continue;
    std::string line = absl::StrFormat(
        "kit: register %s: as shipped (prefault + chunks) %.3f s/GiB", size, *chunked);
    if (const double* first = Value(r, absl::StrCat("Register/chunked/", size), "first_chunk_ms")) {
      absl::StrAppendFormat(&line, ", first chunk usable after %.0f ms", *first);
    }
    if (const double* v =
            Value(r, absl::StrCat("Register/prefault+one-call/", size), "s_per_GiB")) {
      absl::StrAppendFormat(&line, "; prefault + one call %.3f s/GiB", *v);
    }
    if (const double* v = Value(r, absl::StrCat("Register/one-call/", size), "s_per_GiB")) {
      absl::StrAppendFormat(&line, "; one call %.3f s/GiB", *v);
    }
    absl::StrAppendFormat(&line, " (goal <= 0.03 s/GiB: %s)", Verdict(*chunked <= 0.03));
    out.push_back(std::move(line));
  }
  for (const KitCase& c : p.cases) {
    if (c.group != KitGroup::kRegisterUnderTraffic) continue;
    const double* idle = Value(r, c.name, "p50_idle_us");
    const double* during = Value(r, c.name, "p50_during_us");
    if (idle == nullptr || during == nullptr || *idle <= 0) continue;
    const double added = 100 * (*during - *idle) / *idle;
    out.push_back(absl::StrFormat(
        "kit: 64KiB copies while %s registers: p50 %.1f us idle, %.1f us during (%+.1f %%; goal <= "
        "5 %%: %s)",
        SizeName(c.bytes), *idle, *during, added, Verdict(added <= 5.0)));
  }
  for (const KitCase& c : p.cases) {
    if (!c.skipped.empty()) {
      out.push_back(absl::StrCat("kit: skipped ", c.name, ": ", c.skipped));
      continue;
    }
    auto it = r.find(c.name);
    if (it == r.end()) {
      out.push_back(absl::StrCat("kit: no result for ", c.name, " (not run, or stopped)"));
    } else if (!it->second.error.empty()) {
      out.push_back(absl::StrCat("kit: FAILED ", c.name, ": ", it->second.error));
    }
  }
  return out;
}

std::string KitJson(const KitPlan& p, const KitRecords& r) {
  const KitMachine& m = p.machine;
  nlohmann::json j;
  j["machine"] = {{"device", m.device_name},
                  {"device_free_bytes", m.device_free_bytes},
                  {"host_available_bytes", m.host_available_bytes},
                  {"host_cpus", m.host_cpus},
                  {"gpu_numa_node", m.gpu_numa_node}};
  for (const auto& n : m.numa_nodes)
    j["machine"]["numa_nodes"].push_back({{"node", n.first}, {"free_bytes", n.second}});
  j["budget_s"] = p.budget_s;
  j["planned_s"] = p.planned_s();
  j["copy_batch_bytes"] = p.copy_batch_bytes;
  j["remote_node"] = p.remote_node;
  j["cases"] = nlohmann::json::array();
  for (const KitCase& c : p.cases) {
    nlohmann::json e = {{"name", c.name},     {"group", KitGroupName(c.group)},
                        {"source", c.source}, {"direction", c.h2d ? "h2d" : "d2h"},
                        {"bytes", c.bytes},   {"count", c.count},
                        {"est_s", c.est_s}};
    auto it = r.find(c.name);
    if (!c.skipped.empty()) {
      e["status"] = "skipped";
      e["why"] = c.skipped;
    } else if (it == r.end()) {
      e["status"] = "planned";  // to run; no record (a dry run, or stopped before it)
    } else if (!it->second.error.empty()) {
      e["status"] = "failed";
      e["why"] = it->second.error;
    } else {
      e["status"] = "measured";
    }
    if (it != r.end()) e["values"] = it->second.values;
    j["cases"].push_back(std::move(e));
  }
  j["summary"] = KitSummary(p, r);
  return j.dump(1);
}

}  // namespace cxlkv::gpu
