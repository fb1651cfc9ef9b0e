#include "cxlkv/gpu/plan.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cxlkv/base/bytes.h"
#include "cxlkv/pool/spec.h"

namespace cxlkv::gpu {
namespace {

bool IsPow2(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

std::string Hex(std::uint64_t v) { return absl::StrCat("0x", absl::Hex(v)); }

std::string Range(std::uint64_t begin, std::uint64_t bytes) {
  return absl::StrCat("[", Hex(begin), ", +", base::FormatBytes(bytes), ")");
}

}  // namespace

// ---- registration planning --------------------------------------------------------------

absl::StatusOr<std::vector<ChunkPlan>> PlanChunks(std::uint64_t bytes, std::uint64_t align_bytes,
                                                  std::uint64_t max_chunk_bytes) {
  if (bytes == 0 || bytes % kHostPageBytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("registration size ", bytes, " bytes: must be a non-zero multiple of 4 KiB"));
  }
  if (!IsPow2(align_bytes) || align_bytes < kHostPageBytes) {
    return absl::InvalidArgumentError(absl::StrCat("registration alignment ", align_bytes,
                                                   ": must be a power of two of at least 4 KiB"));
  }
  if (max_chunk_bytes < align_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("maximum chunk ", base::FormatBytes(max_chunk_bytes),
                     " is below the source alignment ", base::FormatBytes(align_bytes),
                     ": a chunk may not end inside a device page; raise the chunk size"));
  }
  const std::uint64_t chunk = max_chunk_bytes / align_bytes * align_bytes;
  std::vector<ChunkPlan> out;
  out.reserve(static_cast<std::size_t>((bytes + chunk - 1) / chunk));
  for (std::uint64_t off = 0; off < bytes; off += chunk) {
    out.push_back(ChunkPlan{off, std::min(chunk, bytes - off)});
  }
  return out;
}

absl::StatusOr<std::vector<ChunkPlan>> PlanRampChunks(std::uint64_t bytes,
                                                      std::uint64_t align_bytes,
                                                      std::uint64_t first_chunk_bytes,
                                                      std::uint64_t max_chunk_bytes) {
  auto flat = PlanChunks(bytes, align_bytes, max_chunk_bytes);  // validates the arguments
  if (!flat.ok() || first_chunk_bytes == 0 || first_chunk_bytes >= max_chunk_bytes) return flat;
  const std::uint64_t cap = max_chunk_bytes / align_bytes * align_bytes;
  std::vector<ChunkPlan> out;
  std::uint64_t want = first_chunk_bytes;
  for (std::uint64_t off = 0; off < bytes;) {
    const std::uint64_t size =
        std::min({std::max(want / align_bytes * align_bytes, align_bytes), cap, bytes - off});
    out.push_back(ChunkPlan{off, size});
    off += size;
    want = want >= cap / 2 ? cap : want * 2;
  }
  return out;
}

absl::string_view MappingKindName(MappingKind kind) noexcept {
  switch (kind) {
    case MappingKind::kDevdax:
      return "devdax";
    case MappingKind::kKmem:
      return "kmem";
    case MappingKind::kMemfd:
      return "memfd";
    case MappingKind::kFileTmpfs:
      return "file on tmpfs";
    case MappingKind::kFileDisk:
      return "file on a disk file system";
    case MappingKind::kHost:
      return "host range";
  }
  return "?";
}

absl::string_view RefusalHint(MappingKind kind) noexcept {
  switch (kind) {
    case MappingKind::kDevdax:
      return "the driver could not pin device-DAX (ZONE_DEVICE) pages: it needs an NVIDIA "
             "driver and kernel that allow long-term pins of devdax memory; otherwise put the "
             "device online as system RAM (daxctl reconfigure-device --mode=system-ram "
             "<dev>) and open it as kmem:node=<N>";
    case MappingKind::kFileDisk:
      return "Linux refuses long-term pins of shared file pages on disk file systems (kernel "
             ">= 6.5); put the pool file on tmpfs (/dev/shm) or hugetlbfs, or use a memfd: "
             "source";
    case MappingKind::kKmem:
      return "every page must be resident to be pinned: the NUMA node may be full; pick a "
             "smaller size= or free memory on the node";
    case MappingKind::kMemfd:
    case MappingKind::kFileTmpfs:
      return "every page must be resident to be pinned: the source may be larger than the "
             "free memory (a sparse file or reserve=0); pick a smaller size= or free memory";
    case MappingKind::kHost:
      return "the range must be mapped, readable and writable, and not already registered "
             "by another library";
  }
  return "";
}

absl::string_view RegStateName(RegState state) noexcept {
  switch (state) {
    case RegState::kQueued:
      return "queued";
    case RegState::kRegistering:
      return "registering";
    case RegState::kRegistered:
      return "registered";
    case RegState::kFailed:
      return "failed";
    case RegState::kUnregistered:
      return "unregistered";
  }
  return "?";
}

double RegistrationInfo::NsPerGiB() const {
  if (bytes_done == 0) return 0;
  return static_cast<double>(register_ns) * static_cast<double>(1ull << 30) /
         static_cast<double>(bytes_done);
}

// ---- RegistrationTable ------------------------------------------------------------------

absl::StatusOr<std::uint64_t> RegistrationTable::Add(absl::string_view name, MappingKind kind,
                                                     std::uint64_t host_addr, std::uint64_t bytes,
                                                     std::uint64_t align_bytes,
                                                     std::uint64_t max_chunk_bytes,
                                                     std::int64_t now_ns,
                                                     std::uint64_t first_chunk_bytes) {
  if (host_addr == 0 || host_addr % kHostPageBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": registration address ", Hex(host_addr),
                                                   " must be non-null and page aligned"));
  }
  if (host_addr + bytes < host_addr) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": range ", Range(host_addr, bytes), " wraps the address space"));
  }
  auto chunks = PlanRampChunks(bytes, align_bytes, first_chunk_bytes, max_chunk_bytes);
  if (!chunks.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": ", chunks.status().message()));
  }
  // The first live registration ending after host_addr is the only candidate before it;
  // the next one starting at or after it is the only candidate after it.
  const std::uint64_t end = host_addr + bytes;
  auto next = live_by_addr_.lower_bound(host_addr);
  auto check = [&](std::map<std::uint64_t, std::uint64_t>::const_iterator it) -> absl::Status {
    const RegistrationInfo& o = regs_.at(it->second);
    if (o.host_addr < end && host_addr < o.host_addr + o.bytes) {
      if (o.host_addr == host_addr && o.bytes == bytes) {
        return absl::AlreadyExistsError(
            absl::StrCat(name, ": ", Range(host_addr, bytes), " is already registered as #", o.id,
                         " (", o.name, ", ", RegStateName(o.state), "); use that registration"));
      }
      return absl::FailedPreconditionError(
          absl::StrCat(name, ": ", Range(host_addr, bytes), " overlaps registration #", o.id, " (",
                       o.name, " ", Range(o.host_addr, o.bytes),
                       "); a host page can be registered once: register "
                       "whole arenas, or unregister #",
                       o.id, " first"));
    }
    return absl::OkStatus();
  };
  if (next != live_by_addr_.end()) {
    if (absl::Status st = check(next); !st.ok()) return st;
  }
  if (next != live_by_addr_.begin()) {
    if (absl::Status st = check(std::prev(next)); !st.ok()) return st;
  }
  RegistrationInfo info;
  info.id = next_id_++;
  info.name = std::string(name);
  info.kind = kind;
  info.host_addr = host_addr;
  info.bytes = bytes;
  info.chunks = std::move(*chunks);
  info.queued_ns = now_ns;
  const std::uint64_t id = info.id;
  regs_.emplace(id, std::move(info));
  live_by_addr_.emplace(host_addr, id);
  return id;
}

RegistrationInfo* RegistrationTable::Find(std::uint64_t id) {
  auto it = regs_.find(id);
  return it == regs_.end() ? nullptr : &it->second;
}

const RegistrationInfo* RegistrationTable::Find(std::uint64_t id) const {
  auto it = regs_.find(id);
  return it == regs_.end() ? nullptr : &it->second;
}

void RegistrationTable::ChunkDone(std::uint64_t id, std::uint64_t device_addr,
                                  std::int64_t begin_ns, std::int64_t end_ns) {
  RegistrationInfo* r = Find(id);
  if (r == nullptr || r->chunks_done >= r->chunks.size()) return;
  if (r->chunks_done == 0) {
    if (r->started_ns == 0) r->started_ns = begin_ns;
    r->first_chunk_ns = end_ns;
  }
  r->chunk_device_addr.push_back(device_addr);
  r->bytes_done += r->chunks[r->chunks_done].bytes;
  ++r->chunks_done;
  r->register_ns += end_ns - begin_ns;
  r->finished_ns = end_ns;
  r->state = r->chunks_done == r->chunks.size() ? RegState::kRegistered : RegState::kRegistering;
}

void RegistrationTable::Failed(std::uint64_t id, absl::Status error, std::int64_t now_ns) {
  RegistrationInfo* r = Find(id);
  if (r == nullptr) return;
  r->state = RegState::kFailed;
  r->error = std::move(error);
  r->finished_ns = now_ns;
  r->chunk_device_addr.clear();
  r->chunks_done = 0;
  r->bytes_done = 0;
  live_by_addr_.erase(r->host_addr);
}

void RegistrationTable::Unregistered(std::uint64_t id) {
  RegistrationInfo* r = Find(id);
  if (r == nullptr) return;
  if (r->state != RegState::kFailed) live_by_addr_.erase(r->host_addr);
  if (r->state != RegState::kFailed) r->state = RegState::kUnregistered;
  r->chunk_device_addr.clear();
  r->chunks_done = 0;
  r->bytes_done = 0;
}

void RegistrationTable::Erase(std::uint64_t id) {
  RegistrationInfo* r = Find(id);
  if (r == nullptr) return;
  if (r->state != RegState::kFailed && r->state != RegState::kUnregistered) return;
  regs_.erase(id);
}

absl::StatusOr<PinnedSpan> RegistrationTable::Lookup(std::uint64_t host_addr,
                                                     std::uint64_t bytes) const {
  auto it = live_by_addr_.upper_bound(host_addr);
  if (it == live_by_addr_.begin()) {
    return absl::NotFoundError(
        absl::StrCat("host range ", Range(host_addr, bytes),
                     " is not in any registered arena; register the arena first"));
  }
  const RegistrationInfo& r = regs_.at(std::prev(it)->second);
  if (host_addr >= r.host_addr + r.bytes) {
    return absl::NotFoundError(
        absl::StrCat("host range ", Range(host_addr, bytes),
                     " is not in any registered arena; register the arena first"));
  }
  const std::uint64_t off = host_addr - r.host_addr;
  // Chunks tile the range in order but need not be equal (PlanRampChunks): the last chunk
  // starting at or before off.
  const auto next =
      std::upper_bound(r.chunks.begin(), r.chunks.end(), off,
                       [](std::uint64_t o, const ChunkPlan& ch) { return o < ch.offset; });
  const auto c = static_cast<std::uint32_t>(std::prev(next) - r.chunks.begin());
  if (c >= r.chunks_done) {
    return absl::UnavailableError(absl::StrCat(
        "host range ", Range(host_addr, bytes), " is in registration #", r.id, " (", r.name,
        "), which is ", RegStateName(r.state), ": ", r.chunks_done, " of ", r.chunks.size(),
        " chunks pinned; wait for it (Registrar::Wait) before copying"));
  }
  PinnedSpan s;
  s.id = r.id;
  s.chunk = c;
  s.chunk_host_begin = r.host_addr + r.chunks[c].offset;
  s.chunk_host_end = s.chunk_host_begin + r.chunks[c].bytes;
  s.chunk_device_addr = r.chunk_device_addr[c];
  if (host_addr + bytes > s.chunk_host_end) {
    return absl::OutOfRangeError(absl::StrCat(
        "host range ", Range(host_addr, bytes), " crosses the end of chunk ", c,
        " of registration #", r.id, " at ", Hex(s.chunk_host_end), "; split the copy there"));
  }
  return s;
}

std::vector<const RegistrationInfo*> RegistrationTable::All() const {
  std::vector<const RegistrationInfo*> out;
  out.reserve(regs_.size());
  for (const auto& [id, r] : regs_) out.push_back(&r);
  return out;
}

// ---- PagedCache -----------------------------------------------------------------------------

std::uint64_t PagedCache::SpanBytes() const {
  std::uint64_t lo = ~0ull, hi = 0;
  for (std::uint32_t l = 0; l < layers && l < layer_base.size(); ++l) {
    for (std::uint32_t k = 0; k < kv_parts; ++k) {
      lo = std::min(lo, DeviceAddr(0, l, k));
      hi = std::max(hi, DeviceAddr(page_count - 1, l, k) + chunk_bytes);
    }
  }
  return hi > lo ? hi - lo : 0;
}

absl::Status PagedCache::Validate() const {
  if (layers == 0 || layers > kMaxLayers) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged cache: layers = ", layers, "; must be 1..", kMaxLayers));
  }
  if (kv_parts != 1 && kv_parts != 2) {
    return absl::InvalidArgumentError(absl::StrCat("paged cache: kv_parts = ", kv_parts,
                                                   "; must be 1 (K and V together) or 2 (apart)"));
  }
  if (page_count == 0) return absl::InvalidArgumentError("paged cache: page_count is 0");
  if (chunk_bytes == 0 || chunk_bytes % kCopyAlignBytes != 0) {
    return absl::InvalidArgumentError(absl::StrCat("paged cache: chunk_bytes = ", chunk_bytes,
                                                   "; must be a non-zero multiple of 16"));
  }
  if (layer_base.size() != layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("paged cache: ", layer_base.size(), " layer bases for ", layers, " layers"));
  }
  if (page_stride_bytes % kCopyAlignBytes != 0 || kv_stride_bytes % kCopyAlignBytes != 0) {
    return absl::InvalidArgumentError("paged cache: strides must be multiples of 16 bytes");
  }
  for (std::uint32_t l = 0; l < layers; ++l) {
    if (layer_base[l] == 0 || layer_base[l] % kCopyAlignBytes != 0) {
      return absl::InvalidArgumentError(absl::StrCat("paged cache: layer ", l, " base ",
                                                     Hex(layer_base[l]),
                                                     " must be non-null and 16-byte aligned"));
    }
  }
  if (page_count > 1 && page_stride_bytes < chunk_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("paged cache: page stride ", page_stride_bytes,
                                                   " < chunk_bytes ", chunk_bytes,
                                                   ": consecutive pages overlap"));
  }
  // Each (layer, part) is a track of page_count chunks at page_stride. Two tracks are
  // disjoint when their spans are, or when they interleave at the same stride without
  // touching (e.g. K and V, or layers, of one contiguous page).
  struct Track {
    std::uint64_t start, end;
    std::uint32_t layer, part;
  };
  std::vector<Track> tracks;
  tracks.reserve(std::size_t{layers} * kv_parts);
  const std::uint64_t last = std::uint64_t{page_count - 1} * page_stride_bytes;
  for (std::uint32_t l = 0; l < layers; ++l) {
    for (std::uint32_t k = 0; k < kv_parts; ++k) {
      const std::uint64_t s = DeviceAddr(0, l, k);
      if (s + last + chunk_bytes < s) {
        return absl::InvalidArgumentError("paged cache: layer span wraps the address space");
      }
      tracks.push_back(Track{s, s + last + chunk_bytes, l, k});
    }
  }
  std::sort(tracks.begin(), tracks.end(),
            [](const Track& a, const Track& b) { return a.start < b.start; });
  for (std::size_t i = 0; i < tracks.size(); ++i) {
    for (std::size_t j = i + 1; j < tracks.size() && tracks[j].start < tracks[i].end; ++j) {
      const std::uint64_t d = tracks[j].start - tracks[i].start;
      const bool interleaved = page_count == 1
                                   ? d >= chunk_bytes
                                   : d % page_stride_bytes >= chunk_bytes &&
                                         d % page_stride_bytes <= page_stride_bytes - chunk_bytes;
      if (!interleaved) {
        return absl::InvalidArgumentError(
            absl::StrCat("paged cache: layer ", tracks[i].layer, " part ", tracks[i].part,
                         " and layer ", tracks[j].layer, " part ", tracks[j].part,
                         " overlap on the device; check the layer bases and strides"));
      }
    }
  }
  return absl::OkStatus();
}

PagedCache PagedCache::Contiguous(std::uint64_t base, std::uint32_t layers, std::uint32_t kv_parts,
                                  std::uint64_t chunk_bytes, std::uint32_t page_count) {
  PagedCache c;
  c.layers = layers;
  c.kv_parts = kv_parts;
  c.page_count = page_count;
  c.chunk_bytes = chunk_bytes;
  c.page_stride_bytes = std::uint64_t{layers} * kv_parts * chunk_bytes;
  c.kv_stride_bytes = chunk_bytes;
  c.layer_base.resize(layers);
  for (std::uint32_t l = 0; l < layers; ++l) {
    c.layer_base[l] = base + std::uint64_t{l} * kv_parts * chunk_bytes;
  }
  return c;
}

PagedCache PagedCache::LayerSeparate(std::vector<std::uint64_t> layer_base, std::uint32_t kv_parts,
                                     std::uint64_t chunk_bytes, std::uint32_t page_count) {
  PagedCache c;
  c.layers = static_cast<std::uint32_t>(layer_base.size());
  c.kv_parts = kv_parts;
  c.page_count = page_count;
  c.chunk_bytes = chunk_bytes;
  c.page_stride_bytes = chunk_bytes;
  c.kv_stride_bytes = std::uint64_t{page_count} * chunk_bytes;
  c.layer_base = std::move(layer_base);
  return c;
}

std::uint64_t PagedCache::ChunkBytesOf(const pool::KvLayout& layout, std::uint32_t kv_parts) {
  return std::uint64_t{layout.kv_heads} * layout.head_dim * layout.dtype_bytes *
         layout.tokens_per_block * (kv_parts == 1 ? 2 : 1);
}

// ---- copy planning ------------------------------------------------------------------------

absl::string_view DirectionName(Direction d) noexcept {
  return d == Direction::kHostToDevice ? "host-to-device" : "device-to-host";
}

absl::Status ValidateBlocks(const PagedCache& cache, Direction dir,
                            std::span<const BlockCopy> blocks, std::uint32_t layer_begin,
                            std::uint32_t layer_end) {
  if (absl::Status st = cache.Validate(); !st.ok()) return st;
  if (layer_begin >= layer_end || layer_end > cache.layers) {
    return absl::InvalidArgumentError(absl::StrCat("layer range [", layer_begin, ", ", layer_end,
                                                   ") is empty or outside the cache's ",
                                                   cache.layers, " layers"));
  }
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const BlockCopy& b = blocks[i];
    if (b.host_addr == 0 || b.host_addr % kCopyAlignBytes != 0) {
      return absl::InvalidArgumentError(absl::StrCat("block list entry ", i, ": host address ",
                                                     Hex(b.host_addr),
                                                     " must be non-null and 16-byte aligned"));
    }
    if (b.page >= cache.page_count) {
      return absl::InvalidArgumentError(absl::StrCat("block list entry ", i, ": page ", b.page,
                                                     " is outside the cache's ", cache.page_count,
                                                     " pages"));
    }
  }
  // Two blocks must not write one destination: the result would depend on copy order.
  std::vector<std::size_t> order(blocks.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  if (dir == Direction::kHostToDevice) {
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return blocks[a].page != blocks[b].page ? blocks[a].page < blocks[b].page : a < b;
    });
    for (std::size_t i = 1; i < order.size(); ++i) {
      if (blocks[order[i]].page == blocks[order[i - 1]].page) {
        return absl::InvalidArgumentError(absl::StrCat(
            "block list entries ", order[i - 1], " and ", order[i], " both load into page ",
            blocks[order[i]].page, "; each page may be written once per batch"));
      }
    }
  } else {
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      return blocks[a].host_addr != blocks[b].host_addr ? blocks[a].host_addr < blocks[b].host_addr
                                                        : a < b;
    });
    const std::uint64_t block_bytes = cache.BlockBytes();
    for (std::size_t i = 1; i < order.size(); ++i) {
      if (blocks[order[i]].host_addr < blocks[order[i - 1]].host_addr + block_bytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "block list entries ", order[i - 1], " and ", order[i],
            " store into overlapping host blocks at ", Hex(blocks[order[i - 1]].host_addr), " and ",
            Hex(blocks[order[i]].host_addr), " (block size ", base::FormatBytes(block_bytes), ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<CopyPlan> PlanCopies(const PagedCache& cache, Direction dir,
                                    std::span<const BlockCopy> blocks, const PlanOptions& options) {
  const std::uint32_t lb = options.layer_begin;
  const std::uint32_t le = options.layer_end == 0 ? cache.layers : options.layer_end;
  if (absl::Status st = ValidateBlocks(cache, dir, blocks, lb, le); !st.ok()) return st;

  // Host-side pieces, split where a pinned chunk ends.
  struct Piece {
    std::uint64_t host, dev, bytes;
  };
  CopyPlan plan;
  std::vector<Piece> pieces;
  pieces.reserve(blocks.size() * (le - lb) * cache.kv_parts);
  for (const BlockCopy& b : blocks) {
    for (std::uint32_t l = lb; l < le; ++l) {
      for (std::uint32_t k = 0; k < cache.kv_parts; ++k) {
        std::uint64_t host = b.host_addr + cache.HostOffset(l, k);
        std::uint64_t dev = cache.DeviceAddr(b.page, l, k);
        std::uint64_t left = cache.chunk_bytes;
        ++plan.segments;
        plan.bytes += left;
        while (left > 0) {
          std::uint64_t n = left;
          if (options.host_chunk_end) {
            const std::uint64_t end = options.host_chunk_end(host);
            if (end > host) n = std::min(n, end - host);
          }
          pieces.push_back(Piece{host, dev, n});
          host += n;
          dev += n;
          left -= n;
        }
      }
    }
  }
  const bool h2d = dir == Direction::kHostToDevice;
  std::sort(pieces.begin(), pieces.end(),
            [&](const Piece& a, const Piece& b) { return h2d ? a.host < b.host : a.dev < b.dev; });
  // Coalesce pieces adjacent on both sides and inside one pinned chunk.
  std::vector<Piece> merged;
  merged.reserve(pieces.size());
  for (const Piece& p : pieces) {
    if (!merged.empty()) {
      Piece& m = merged.back();
      const bool adjacent = m.host + m.bytes == p.host && m.dev + m.bytes == p.dev;
      const bool same_chunk = !options.host_chunk_end || options.host_chunk_end(m.host) > p.host;
      if (adjacent && same_chunk) {
        m.bytes += p.bytes;
        continue;
      }
    }
    merged.push_back(p);
  }
  for (const Piece& m : merged) {
    for (std::uint64_t off = 0; off < m.bytes;) {
      std::uint64_t n = m.bytes - off;
      if (options.max_op_bytes != 0) n = std::min(n, options.max_op_bytes);
      plan.ops.push_back(h2d ? CopyOp{m.host + off, m.dev + off, n}
                             : CopyOp{m.dev + off, m.host + off, n});
      off += n;
    }
  }
  return plan;
}

}  // namespace cxlkv::gpu
