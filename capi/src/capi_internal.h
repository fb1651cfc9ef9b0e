// capi/src/capi_internal.h — what the C API's translation units share: the handles behind
// cxlkv.h's opaque pool and arena types, error reporting, and the internal entry points one
// part calls in another.
//
//   error.cc   cxlkv_strerror, cxlkv_last_error; Fail and FromStatus below
//   arena.cc   pools, arenas and blocks (cxlkv_pool_*, cxlkv_arena_*, cxlkv_alloc*, ...)
//   domain.cc  the shared prefix domain (cxlkv_domain_*, cxlkv_prefix_*, cxlkv_lease_*,
//              cxlkv_owner_*); defines cxlkv_domain and cxlkv_owner; an arena it grows
//              closes through the arena's close hook
//   gpu.cc     GPU registration and copies (cxlkv_gpu_*)
//   tier.cc    an arena's size class and an NVMe store under the placement rule
//              (cxlkv_tier_*) over a tier::TieredStore; defines cxlkv_tier, a memory user
//              of its arena
//   tier_explain.cc  cxlkv_tier_explain's text and JSON (RenderExplain below)
//   key.cc     keys from an engine's own block digest and from a name (cxlkv_prefix_key_from_*),
//              and an LMCache object's name and key in the index (cxlkv_lmcache_index_*)
//
// Rule: inside the library, one part reaches another only through the C++ functions
// declared here, never by calling an exported cxlkv_* function (such a call would go
// through the PLT, where another library could interpose it, and would tie the parts
// together through the public ABI). Nothing here throws.
#ifndef CXLKV_CAPI_SRC_CAPI_INTERNAL_H_
#define CXLKV_CAPI_SRC_CAPI_INTERNAL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "cxlkv/allocator/block_allocator.h"
#include "cxlkv/base/mutex.h"
#include "cxlkv/cxlkv.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/region.h"

namespace cxlkv::tier {
struct ExplainReport;
}  // namespace cxlkv::tier

// Marks a definition as part of libcxlkv.so's ABI (everything else is hidden).
#define CXLKV_API extern "C" __attribute__((visibility("default")))

struct cxlkv_pool {
  std::unique_ptr<cxlkv::pool::Region> region;  // each arena maps a duplicate of it
  bool arena_open = false;
};

struct cxlkv_arena {
  cxlkv_pool* pool;  // nullptr for an arena in a domain's extent
  std::unique_ptr<cxlkv::allocator::BlockAllocator> alloc;
  // An arena in an extent of a pooled domain (cxlkv_domain_grow): its domain, extent, and
  // the flag the domain's watchdog sets when the extent's capacity lease lapsed.
  cxlkv_domain* domain = nullptr;
  std::uint32_t extent = 0;
  const std::atomic<bool>* revoked = nullptr;
  // Set by the part that made the arena when closing it is more than deleting it (an arena in
  // a domain's extent: the extent is given back): cxlkv_arena_close calls it instead, so the
  // arena's part never calls into the domain's.
  std::function<void(cxlkv_arena*)> close = nullptr;
};

namespace cxlkv::capi {

// ---- error.cc
// Sets this thread's cxlkv_last_error() message and returns code.
int Fail(int code, std::string message);
// CXLKV_OK for an ok status; otherwise its CXLKV_E_* code, with its message set as above.
int FromStatus(const absl::Status& st);
// This thread's last message (what cxlkv_last_error() returns).
const std::string& LastError();

// ---- arena.cc
// The arena behind a C handle.
const pool::Arena& ArenaOf(const cxlkv_arena* arena);
// Whether ref names a block of arena a (by the arena's uuid).
bool SameArena(const cxlkv_arena* a, const cxlkv_block_ref* ref);
pool::KvLayout FromLayout(const cxlkv_kv_layout& l);
// Every call on an arena whose extent was revoked fails: its memory is private now.
inline bool Revoked(const cxlkv_arena* a) {
  return a->revoked != nullptr && a->revoked->load(std::memory_order_relaxed);
}
// CXLKV_E_REVOKED with a message naming the arena and its extent.
int FailRevoked(const cxlkv_arena* a);
// cxlkv_ref_to_addr: the address of ref's block in arena a.
int RefToAddr(const cxlkv_arena* a, const cxlkv_block_ref* ref, void** addr);
// Bytes of block `index` of arena `arena` (its class's block bytes); 0 past the last block.
std::uint64_t BlockBytes(const pool::Arena& arena, std::uint32_t index);

// What else reaches an arena's memory, bypassing this process's page tables: a GPU
// registration's pinned pages stay DMA targets after a revocation swaps the mapping, and
// after the arena closes (audit #8). Each such use is recorded with the function that ends
// it; DropMemoryUsers runs them before the arena's memory is given away (its extent revoked
// or shrunk, the arena closed). One library-wide lock guards the record; a drop function
// runs under it and must not call these functions. `owner` and `id` name a use for removal.
void AddMemoryUser(const cxlkv_arena* a, const void* owner, std::uint64_t id,
                   std::function<void()> drop);
// Forgets one use (it ended otherwise, e.g. cxlkv_gpu_unregister) without running it.
void RemoveMemoryUser(const void* owner, std::uint64_t id);
// Forgets every use by `owner` (a gpu handle closing: it ends them all itself).
void RemoveMemoryUsers(const void* owner);
// Ends and forgets every use of arena a's memory.
void DropMemoryUsers(const cxlkv_arena* a);

// ---- tier_explain.cc ---------------------------------------------------------------------------

// cxlkv_tier_explain's report as text, or as JSON when `json` (CXLKV_TIER_EXPLAIN_JSON).
std::string RenderExplain(const tier::ExplainReport& e, bool json);

}  // namespace cxlkv::capi

#endif  // CXLKV_CAPI_SRC_CAPI_INTERNAL_H_
