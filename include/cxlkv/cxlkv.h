/* cxlkv.h — the stable C API of cxlkv: CXL memory pools, KV arenas and the KV block allocator.
 *
 * Objects
 *   cxlkv_pool   one opened memory source, named by a spec string:
 *                  "devdax:/dev/dax0.0", "kmem:node=2", "file:/dev/shm/kv?size=8G",
 *                  "memfd:?size=1G"
 *   cxlkv_arena  a KV arena formatted in a pool, with its block allocator. One arena per pool.
 *   cxlkv_block_ref  (arena uuid, index, generation): names one allocation of a block; valid
 *                in every process that maps the arena, stale once the block is freed.
 *   cxlkv_domain, cxlkv_owner  the shared prefix index of a CXL domain (below)
 *   cxlkv_tier   a size class of an arena plus an NVMe store, with the CXL-vs-NVMe placement
 *                rule moving blocks between them (below)
 *   cxlkv_gpu    a CUDA device copying blocks to and from registered arenas (below)
 *
 * Errors: every function that can fail returns 0 or a negative CXLKV_E_* code.
 * cxlkv_strerror(code) names the code; cxlkv_last_error() returns this thread's message for
 * the last failure, naming the object and the fix (valid until the thread's next cxlkv call).
 *
 * Thread-safety: pools and arenas may be used from any number of threads at once; alloc/free
 * are lock-free in the common case (a per-thread cache). Close an arena only after all
 * threads stopped using it, and close arenas before their pool.
 *
 * Lifetime: blocks belong to the process that allocated them. When it closes the arena or
 * dies, they return to the free pool, except blocks passed to cxlkv_block_persist().
 */
#ifndef CXLKV_CXLKV_H_
#define CXLKV_CXLKV_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  CXLKV_OK = 0,
  CXLKV_E_INVALID = -1,     /* bad argument or spec */
  CXLKV_E_NOT_FOUND = -2,   /* no such device, file, node or arena */
  CXLKV_E_PERMISSION = -3,  /* the source cannot be opened or mapped by this user */
  CXLKV_E_EXISTS = -4,      /* an arena is already there (pass CXLKV_FORMAT_FORCE) */
  CXLKV_E_CORRUPT = -5,     /* corrupt or torn metadata; nothing was modified */
  CXLKV_E_MISMATCH = -6,    /* foreign data, other layout or version, or in use */
  CXLKV_E_FULL = -7,        /* no free block of that class, or no owner slot */
  CXLKV_E_DOUBLE_FREE = -8, /* the block was already freed */
  CXLKV_E_STALE = -9,       /* the ref's generation was freed and the block reused */
  CXLKV_E_FOREIGN = -10,    /* not a block (or pointer) of this arena */
  CXLKV_E_INTERNAL = -11,   /* an unexpected OS error; see cxlkv_last_error() */
  CXLKV_E_NO_CUDA = -12,    /* this libcxlkv was built without CUDA: no GPU functions */
  CXLKV_E_NO_DEVICE = -13,  /* no CUDA device (none present, no driver, or no such ordinal) */
  CXLKV_E_PENDING = -14,    /* not finished yet (registration or copy): poll again */
  CXLKV_E_CUDA = -15,       /* the CUDA driver refused or failed; see cxlkv_last_error() */
  CXLKV_E_REVOKED = -16,    /* the arena's extent was revoked (capacity lease lapsed): close it */
  CXLKV_E_BUSY = -17,       /* refused for now: I/O in flight, pinned, or cooling down; retry */
};

typedef struct cxlkv_pool cxlkv_pool;
typedef struct cxlkv_arena cxlkv_arena;

typedef struct cxlkv_block_ref {
  uint8_t arena_uuid[16];
  uint32_t index;
  uint32_t generation;
} cxlkv_block_ref;

/* KV layout: block bytes = 2 * layers * kv_heads * head_dim * dtype_bytes * tokens_per_block */
typedef struct cxlkv_kv_layout {
  uint32_t layers;
  uint32_t kv_heads;
  uint32_t head_dim;
  uint32_t dtype_bytes;
  uint32_t tokens_per_block;
  uint32_t layer_separate; /* 0: contiguous block, 1: layer-separate */
} cxlkv_kv_layout;

#define CXLKV_MAX_CLASSES 8
#define CXLKV_FORMAT_FORCE 1u /* overwrite an arena or foreign data (never one in use) */

typedef struct cxlkv_arena_options {
  cxlkv_kv_layout layout;
  /* Size classes in tokens per block; 0 entries end the list. All zero: one class of
   * layout.tokens_per_block. class_weights share the space (0 means 1). */
  uint32_t class_tokens[CXLKV_MAX_CLASSES];
  uint32_t class_weights[CXLKV_MAX_CLASSES];
  uint32_t owner_slots; /* processes that may attach at once; 0 means 256 */
  uint32_t flags;       /* CXLKV_FORMAT_* */
} cxlkv_arena_options;

typedef struct cxlkv_class_stats {
  uint64_t block_bytes;
  uint32_t total_blocks;
  uint32_t free_blocks;
  uint32_t cached_blocks;    /* reserved in per-thread caches of some process */
  uint32_t allocated_blocks; /* owned by live processes */
  uint32_t persisted_blocks;
  uint32_t largest_free_run;
  uint64_t allocs; /* this process */
  uint64_t frees;  /* this process */
  uint64_t failed_allocs;
} cxlkv_class_stats;

typedef struct cxlkv_arena_stats {
  uint8_t arena_uuid[16];
  uint64_t region_bytes;
  uint64_t metadata_bytes;
  uint32_t owners_active;
  uint32_t class_count;
  uint64_t bad_frees; /* double, stale and foreign frees detected in this process */
  cxlkv_class_stats classes[CXLKV_MAX_CLASSES];
} cxlkv_arena_stats;

/* Opens a memory source. */
int cxlkv_pool_open(const char* spec, cxlkv_pool** out);
void cxlkv_pool_close(cxlkv_pool* pool);

/* Formats a new arena in the pool. Refuses an existing arena or foreign data unless
 * CXLKV_FORMAT_FORCE, and an arena in use by a live process always. */
int cxlkv_arena_create(cxlkv_pool* pool, const cxlkv_arena_options* options, cxlkv_arena** out);
/* Opens the pool's arena; `expect` (may be NULL) must match its layout. */
int cxlkv_arena_open(cxlkv_pool* pool, const cxlkv_kv_layout* expect, cxlkv_arena** out);
/* Returns every block this process still owns (not persisted) to the free pool. */
void cxlkv_arena_close(cxlkv_arena* arena);

/* Block size in bytes of a size class, 0 if the class does not exist. */
uint64_t cxlkv_block_size(const cxlkv_arena* arena, uint32_t size_class);

/* Allocates one block; *addr (may be NULL) gets its address in this process. */
int cxlkv_alloc(cxlkv_arena* arena, uint32_t size_class, cxlkv_block_ref* ref, void** addr);
int cxlkv_free(cxlkv_arena* arena, const cxlkv_block_ref* ref);
/* Allocates exactly n blocks or none. addrs may be NULL. */
int cxlkv_alloc_bulk(cxlkv_arena* arena, uint32_t size_class, size_t n, cxlkv_block_ref* refs,
                     void** addrs);
/* Frees n blocks; returns 0 if all were freed, else the first error (the rest are freed). */
int cxlkv_free_bulk(cxlkv_arena* arena, const cxlkv_block_ref* refs, size_t n);
/* Keeps a block after this process closes the arena or exits; any process may free it. */
int cxlkv_block_persist(cxlkv_arena* arena, const cxlkv_block_ref* ref);

/* Address of an allocated block in this process; validates uuid, index and generation. */
int cxlkv_ref_to_addr(const cxlkv_arena* arena, const cxlkv_block_ref* ref, void** addr);
/* The ref of the allocated block starting at addr. */
int cxlkv_addr_to_ref(const cxlkv_arena* arena, const void* addr, cxlkv_block_ref* ref);

int cxlkv_arena_stats_get(const cxlkv_arena* arena, cxlkv_arena_stats* stats);

/* Copies len bytes into a block with non-temporal stores (movdir64b / AVX-512 streaming
 * stores, chosen by CPUID): the data is in memory on return, no flush needed. */
void cxlkv_copy_to_block(void* block, const void* src, size_t len);

/* ---- Shared prefix blocks across the hosts of a CXL domain (docs/coherence.md) ----------
 *
 * A domain region (any source spec; on real hardware a switch-pooled devdax) holds the
 * shared prefix index, the hosts' lease rows and request rings. One process per domain
 * runs the owner role (cxlkv_owner_*: applies publications, fences silent hosts, reclaims);
 * every host joins with its own host id. A lookup takes no lease; data may be used only
 * under a lease, before its deadline, and a copy counts only if cxlkv_lease_validate()
 * succeeds after it. A domain handle is used by one thread at a time. */

typedef struct cxlkv_domain cxlkv_domain;
typedef struct cxlkv_owner cxlkv_owner;

typedef struct cxlkv_domain_geometry {
  uint32_t max_hosts;     /* 0: 8 */
  uint32_t index_entries; /* 0: 4096 (rounded up to a power of two) */
  uint32_t lease_rows;    /* per host; 0: 256 */
  uint32_t ring_slots;    /* per host; 0: 64 */
  uint32_t lease_ttl_ms;  /* 0: 2000 */
  uint32_t host_ttl_ms;   /* 0: 2000 */
  uint32_t grace_ms;      /* 0: 100 */
} cxlkv_domain_geometry;

typedef struct cxlkv_prefix_key {
  uint64_t lo, hi;
} cxlkv_prefix_key;

typedef struct cxlkv_prefix_hit {
  uint32_t entry;
  uint32_t entry_gen;
  cxlkv_block_ref ref;
  uint32_t publisher; /* host id */
} cxlkv_prefix_hit;

typedef struct cxlkv_lease {
  uint32_t row;
  uint32_t entry;
  uint32_t entry_gen;
  cxlkv_block_ref ref;
  int64_t deadline_ms; /* CLOCK_MONOTONIC ms: do not use the data after it */
  uint64_t id;         /* which acquisition (a stale copy never renews or releases a newer one) */
} cxlkv_lease;

/* Bytes a domain of this geometry needs (0 fields take the defaults). */
uint64_t cxlkv_domain_bytes(const cxlkv_domain_geometry* g);
/* Formats an empty domain on a source (owner role, once). */
int cxlkv_domain_format(const char* spec, const cxlkv_domain_geometry* g);
/* Joins as host_id with a new incarnation. spec is the domain's source spec, or
 * "orchestrator:/run/cxlkv/<domain>.sock" to join through the domain's cxlkv-orchestrator
 * (membership and heartbeats to it run on a thread of their own; the prefix domain is the
 * one it names; CXLKV_E_PERMISSION if it does not admit this host id or this uid). */
int cxlkv_domain_join(const char* spec, uint32_t host_id, cxlkv_domain** out);
/* Leaves the domain; arenas still grown in it are closed and their extents given back, and
 * every raw extent still held is revoked first (its on_revoke runs), all written back before
 * the orchestrator hears of it. */
void cxlkv_domain_leave(cxlkv_domain* d);

/* Pooled capacity (a domain joined as "orchestrator:<socket>"): KV arenas in extents of the
 * domain's pooled region, lent by the orchestrator under a capacity lease that heartbeats
 * renew. cxlkv_domain_grow takes one more extent and formats a fresh arena in it (options
 * may be NULL: the default layout); close it with cxlkv_domain_shrink or cxlkv_arena_close,
 * which give the extent back. Blocks published from such an arena keep the extent out of the
 * free pool (quarantined) until the orchestrator has reclaimed them, even if this host dies.
 * If the lease lapses (the orchestrator unreachable for most of a lease, or this host fenced)
 * the extent is revoked: the process's mapping of it is replaced by private memory, its blocks
 * read as zero, and every call on the arena fails with CXLKV_E_REVOKED. Whichever way an
 * extent leaves (shrink, close, leave, revocation), GPU registrations of its arena end first
 * and every cache line this host dirtied in it is written back before it is no longer this
 * host's (docs/orchestrator.md, "Writing back before an extent leaves").
 * CXLKV_E_INVALID: not joined through an orchestrator; CXLKV_E_FULL: no free extent, or the
 * host's share is used up. */
int cxlkv_domain_grow(cxlkv_domain* d, const cxlkv_arena_options* options, cxlkv_arena** out);
int cxlkv_domain_shrink(cxlkv_domain* d, cxlkv_arena* arena);
/* Raw pooled capacity, for memory the caller maps and formats itself (the preload shim's
 * heap): one more extent and the source spec of its window (a devdax:/file: spec with
 * offset= and length=; map it with MAP_SHARED). When the lease lapses, on_revoke(ctx,
 * extent) is called from the domain's watchdog thread; when it returns, the caller must no
 * longer write the window (it keeps at least a quarter of a capacity lease before the
 * orchestrator may lend the extent to another host). cxlkv_domain_shrink_extent gives it
 * back (write the window back first: munmap writes nothing back); cxlkv_domain_leave calls
 * on_revoke for every extent still held, then gives them back. Errors as cxlkv_domain_grow;
 * CXLKV_E_INVALID also when spec_len is too small for the spec (its length is in *length). */
typedef void (*cxlkv_revoke_fn)(void* ctx, uint32_t extent);
int cxlkv_domain_grow_extent(cxlkv_domain* d, cxlkv_revoke_fn on_revoke, void* ctx,
                             uint32_t* extent, uint64_t* length, char* spec, size_t spec_len);
int cxlkv_domain_shrink_extent(cxlkv_domain* d, uint32_t extent);
/* The address of a block in any extent arena of the domain's pool (a prefix hit's ref, which
 * may name another host's arena). Do not read it directly: read a leased block with
 * cxlkv_lease_copy_out, or zero-copy through cxlkv_block_invalidate (below).
 * CXLKV_E_NOT_FOUND: no assigned extent holds that arena; CXLKV_E_STALE: not that block. */
int cxlkv_domain_resolve(cxlkv_domain* d, const cxlkv_block_ref* ref, const void** addr);
/* Call at least every host_ttl/4. Blocks the owner handed back that belong to `arena`
 * (may be NULL) are freed there; *freed (may be NULL) counts them. CXLKV_E_MISMATCH:
 * this host was fenced (its leases are gone) and has rejoined. */
int cxlkv_domain_heartbeat(cxlkv_domain* d, cxlkv_arena* arena, size_t* freed);

/* A namespace binds tenant, model and KV layout; hits never cross namespaces. */
uint64_t cxlkv_namespace(const char* tenant, const char* model, const char* kv_layout);
/* Chains a block's key from its parent's (NULL for the first block) and its tokens. */
cxlkv_prefix_key cxlkv_prefix_key_chain(uint64_t ns, const cxlkv_prefix_key* parent,
                                        const uint32_t* tokens, size_t n_tokens);
/* A block's key from a digest the engine computed itself (vLLM's block hash, SGLang's page
 * hash: already chained over the block's tokens and its parent's hash), for engines that do
 * not keep token ids. digest_len is 16 (a 128-bit digest) or 32 (256-bit); anything else is
 * CXLKV_E_INVALID, naming the length. `digest` is the digest's bytes in the order the engine's
 * hash function emits them (Python: hashlib's .digest(), bytes.fromhex() of a hex digest;
 * every process that must find the block has to pass the same bytes). `parent` is the
 * previous block's key (from this function), NULL for the first block of a sequence: chains
 * link as with cxlkv_prefix_key_chain, and the prefix index records the parent.
 * The key is XXH3-128 with seed 0x63786c6b76646731 ("cxlkvdg1"; the token chain uses 0, so
 * digest keys and token keys come from different hash functions) over: ns, parent.lo and
 * parent.hi as little-endian 64-bit words (the zero key for no parent), digest_len as one
 * byte, then the digest bytes; key.lo / key.hi are the hash's low / high 64 bits as host
 * integers, and the all-zero key (the root) is never returned (it becomes lo = 1).
 * Equal (ns, parent, digest) give equal keys in every process, on every host and in every
 * version of this library (the format is frozen; tests pin it), so engines on different
 * hosts find each other's blocks. Pure: any thread. *out is written only on success. */
int cxlkv_prefix_key_from_digest(uint64_t ns, const cxlkv_prefix_key* parent, const void* digest,
                                 size_t digest_len, cxlkv_prefix_key* out);
/* The key of an object with a name of its own rather than a place in a token chain (an LMCache
 * object in the domain's index: its key's fields joined by 0x1F, docs/lmcache.md "Keys in the
 * domain's index"): XXH3-128, seed 0x63786c6b766e6d31 ("cxlkvnm1"), of ns as a little-endian
 * 64-bit word followed by the name's bytes. A frozen format; never the zero key. */
int cxlkv_prefix_key_from_name(uint64_t ns, const void* name, size_t name_len,
                               cxlkv_prefix_key* out);

/* An LMCache object's key (LMCache's EncodedObjectKey), for its entry in a domain's prefix
 * index, where the orchestrator's LMCache coordinator publishes every finished object
 * (docs/lmcache.md "Keys in the domain's index"). Strings are NUL-terminated UTF-8, so a
 * field holding a NUL byte cannot be passed (LMCache refuses one in the salt; none is in a
 * hex chunk hash). */
typedef struct cxlkv_lmcache_key {
  const char* chunk_hash_hex; /* lower-case hex of an even length */
  const char* model_name;     /* no '@' */
  int64_t kv_rank;            /* any value, written in decimal */
  int64_t object_group_id;    /* >= 0 */
  const char* cache_salt;     /* NULL or "": no salt; no '@', '/' or '\\', at most 128 chars */
} cxlkv_lmcache_key;
/* The object's key in the index, computed by the coordinator's own code (so it is the key
 * the coordinator published): *ns (may be NULL) gets the tenant's namespace,
 * cxlkv_namespace(tenant, "lmcache", layout_id) (layout_id: the domain's [lmcache] layout_id,
 * LMCache's --l1-shared-layout-id), and *out cxlkv_prefix_key_from_name(*ns, the name
 * cxlkv_lmcache_index_name writes). Look it up with cxlkv_prefix_lookup in that namespace.
 * CXLKV_E_INVALID, naming the field and in LMCache's words, for a NULL argument or a key
 * LMCache refuses (the coordinator refuses it too, so no such object is ever in the index);
 * nothing is written then. A frozen format (tests/capi_lmcache_key_test.cc pins it). Pure:
 * any thread. */
int cxlkv_lmcache_index_key(const char* tenant, const char* layout_id, const cxlkv_lmcache_key* key,
                            uint64_t* ns, cxlkv_prefix_key* out);
/* The object's name in the index: chunk_hash_hex, model_name, kv_rank, object_group_id and
 * cache_salt, the integers in decimal, joined by the byte 0x1F. Writes at most len bytes
 * including the NUL into buf; *needed (may be NULL) gets the full size including the NUL.
 * buf NULL and len 0: only *needed (returns 0). CXLKV_E_INVALID as cxlkv_lmcache_index_key,
 * and when len is too small (buf then holds nothing). Pure: any thread. */
int cxlkv_lmcache_index_name(const cxlkv_lmcache_key* key, char* buf, size_t len, size_t* needed);

/* Finds a published block; takes no lease. CXLKV_E_NOT_FOUND on a miss. */
int cxlkv_prefix_lookup(cxlkv_domain* d, uint64_t ns, const cxlkv_prefix_key* key,
                        cxlkv_prefix_hit* hit);
/* Publishes a block of `arena` the caller has written (and will not modify): the block is
 * persisted in the arena and handed to the domain; it comes back through heartbeat when
 * reclaimed, or at once if the prefix was already published. CXLKV_E_FULL: the request
 * ring is full (the owner is behind or down). */
int cxlkv_prefix_publish(cxlkv_domain* d, uint64_t ns, const cxlkv_prefix_key* key,
                         const cxlkv_prefix_key* parent, cxlkv_arena* arena,
                         const cxlkv_block_ref* ref);

/* One block of a chain publish: its key, the key it chains on (all-zero for a sequence's
 * first block) and the block (of the arena passed beside). */
typedef struct cxlkv_publish_item {
  cxlkv_prefix_key key;
  cxlkv_prefix_key parent;
  cxlkv_block_ref ref;
} cxlkv_publish_item;
/* Publishes items[0..n), blocks of `arena` the caller has written (and will not modify), in
 * one ring transaction: every request written, one fence, every block persisted in the arena,
 * then one announcement, so the owner applies all of them or none, and a prefill host pays one
 * fence and one shared-line write per chain instead of per block. When the request ring has
 * no room for all n, waits up to timeout_ms for the owner to drain it (polling the owner's
 * line in the domain with a short backoff; 0: no wait). On success every block is handed to
 * the domain (each comes back through heartbeat when reclaimed, or at once if its prefix was
 * already published). On any error nothing is announced and the caller still owns every block
 * (a block persisted before the error stays allocated; free it or publish it again).
 * CXLKV_E_INVALID: a NULL argument, or n above the domain's ring_slots (split the chain);
 * CXLKV_E_FOREIGN: a ref names another arena; CXLKV_E_FULL: still no room after timeout_ms
 * (the owner is behind or down), or this host was fenced (heartbeat, then retry). n == 0 is
 * a no-op. Not thread-safe on one domain handle, like the other cxlkv_prefix_* calls. */
int cxlkv_prefix_publish_chain(cxlkv_domain* d, uint64_t ns, const cxlkv_publish_item* items,
                               size_t n, cxlkv_arena* arena, uint32_t timeout_ms);

/* Takes a lease on a hit. CXLKV_E_STALE: retired meanwhile; CXLKV_E_FULL: no free lease
 * row, or the owner has not confirmed this host recently (retry after a heartbeat). */
int cxlkv_lease_acquire(cxlkv_domain* d, const cxlkv_prefix_hit* hit, cxlkv_lease* lease);
/* Looks up and leases a request's prefix in one pass: keys[0..n) are its blocks in order
 * (each chained on the one before). Leases the longest leading run of published keys into
 * leases[0..*n_leased) and returns 0; *n_leased is 0 when the first key misses. The run
 * also ends at a key retired meanwhile or when lease rows run out. Cheaper per block than
 * lookup + acquire one by one: each step's cache-line work shares one fence.
 * CXLKV_E_FULL: not even the first key could be leased (no free row, or the owner has not
 * confirmed this host recently). */
int cxlkv_lease_acquire_chain(cxlkv_domain* d, uint64_t ns, const cxlkv_prefix_key* keys,
                              size_t n, cxlkv_lease* leases, size_t* n_leased);
/* Releases n leases with one fence. */
int cxlkv_lease_release_many(cxlkv_domain* d, cxlkv_lease* leases, size_t n);
/* Extends a lease. CXLKV_E_STALE: it expired, possibly while the renewal was being
 * written (the host stalled); either way it is released: acquire again. */
int cxlkv_lease_renew(cxlkv_domain* d, cxlkv_lease* lease);
int cxlkv_lease_release(cxlkv_domain* d, cxlkv_lease* lease);
/* After reading the block: 0 if what was read is good, CXLKV_E_STALE to discard it (the
 * lease expired, or the block was retired or reused since the lease was taken). It checks the
 * index entry only: it cannot tell stale cache lines of the block's memory from fresh ones,
 * which is why every read starts with an invalidation (below). */
int cxlkv_lease_validate(cxlkv_domain* d, const cxlkv_lease* lease);

/* Asks the owner to retire this host's published entry for key (applied at the owner's next
 * step). Leases already taken keep the block from reuse until they end, but reads validated
 * after the retirement fail with CXLKV_E_STALE. CXLKV_E_FULL: the request ring is full. */
int cxlkv_prefix_retire(cxlkv_domain* d, uint64_t ns, const cxlkv_prefix_key* key);

/* ---- Reading a leased block (docs/coherence.md, "Reading blocks through the C API") -------
 *
 * Caches are not coherent between the hosts of a CXL domain. This host may still hold lines
 * of a block's memory from before the publisher wrote it (an earlier generation of the
 * block, or another arena the extent held), and plain loads return them; cxlkv_lease_validate
 * cannot notice, since it checks only the index entry. So every read of a block another
 * process or host wrote begins by invalidating (clflushopt + mfence) the lines it will read,
 * after the lease was acquired: while a lease holds, the block is immutable and cannot be
 * reused, so lines fetched from memory after that point are the published bytes.
 *
 * `arena`, in both calls below: the arena handle that maps the block's arena in this process
 * (cxlkv_arena_open on the publisher's pool), or NULL for a domain joined through an
 * orchestrator, where the block is found in this host's extent arenas or in another host's
 * extent (as cxlkv_domain_resolve). The range read is [offset, offset + len) of the block:
 * len >= 1 and offset + len <= the block's size, else CXLKV_E_INVALID (the message gives
 * the size). Other errors: CXLKV_E_INVALID for a NULL domain, lease or dst/addr argument
 * (or arena NULL on a domain not joined through an orchestrator); CXLKV_E_FOREIGN when
 * `arena` is not the lease's block's arena; CXLKV_E_NOT_FOUND when no mapped arena holds it;
 * CXLKV_E_STALE when the lease's deadline has passed (nothing is read) or the arena no
 * longer holds that generation of the block.
 *
 * cxlkv_lease_copy_out — the complete read, the one to use unless the data must stay in
 * place: invalidates the range, copies it into dst (ordinary loads; non-temporal loads gain
 * nothing on write-back memory), then validates the lease (cxlkv_lease_validate). On a busy
 * host it keeps the lease for the whole copy (docs/coherence.md, "Busy hosts"): a lease with
 * less time left than the copy takes at the slowest rate this host measured is renewed first,
 * and one that expired before or during the copy (the caller was descheduled, stopped, or held
 * a lock such as Python's GIL) is taken again on the same entry and generation and the block
 * copied again; *lease is updated in place (deadline, and row and id when taken again) and is
 * released as usual afterwards. Returns 0 when dst holds the bytes as published;
 * CXLKV_E_STALE when the block was retired or reused, or no lease could be kept (the owner is
 * down): dst was written and must be discarded. Cost: one clflushopt per 64-byte line, one
 * mfence, the copy, one index-entry read. The domain handle is used by one thread at a time
 * (as for every cxlkv_lease_* call). */
int cxlkv_lease_copy_out(cxlkv_domain* d, const cxlkv_arena* arena, cxlkv_lease* lease,
                         uint64_t offset, void* dst, size_t len);
/* One piece of a scattered copy-out: the arguments of one cxlkv_lease_copy_out call. Several
 * items may name the same lease (a page read into separate K and V buffers, at two offsets). */
typedef struct cxlkv_copy_out_item {
  const cxlkv_arena* arena; /* as cxlkv_lease_copy_out's (NULL: found through the domain) */
  cxlkv_lease* lease;       /* updated in place, as by cxlkv_lease_copy_out */
  uint64_t offset;          /* in the block */
  void* dst;
  size_t len;
} cxlkv_copy_out_item;
/* cxlkv_lease_copy_out for items[0..n), in order, in one call: a reader filling a request's KV
 * slots from many leased blocks crosses into the library once instead of once per block (from
 * Python: one ctypes call instead of n). Each item is exactly one cxlkv_lease_copy_out —
 * invalidated, copied, its lease validated after its own copy (and kept or taken again as
 * there) — and its result code goes to results[i]: 0 when items[i].dst holds the bytes as
 * published, CXLKV_E_STALE when that dst must be discarded, or that call's argument error.
 * One item's failure does not stop the others. Returns 0 when every item succeeded; else the
 * code of the first item that failed on something other than CXLKV_E_STALE (an argument
 * error: a caller's mistake outranks a stale block), or failing that of the first stale one,
 * with cxlkv_last_error() naming that item ("item 3: ..."). CXLKV_E_INVALID, nothing copied
 * and results untouched: d NULL, or items or results NULL with n > 0. n == 0 is a no-op.
 * Cost: the sum of the items' cxlkv_lease_copy_out. Thread-safety as cxlkv_lease_copy_out. */
int cxlkv_lease_copy_out_many(cxlkv_domain* d, const cxlkv_copy_out_item* items, size_t n,
                              int* results);
/* What a busy or stopped machine cost this host's leases since it joined (docs/coherence.md,
 * "Busy hosts"); a host joined through an orchestrator also sends them with its heartbeats
 * (cxlkvctl hosts, the metrics). */
typedef struct cxlkv_lease_stats {
  uint64_t leases_refused_late;     /* no acknowledged heartbeat recent enough */
  uint64_t leases_renewed_for_copy; /* renewed so that a lease lasts its copy */
  uint64_t leases_retaken;          /* expired leases taken again */
  uint64_t copies_retried;          /* the lease expired during a copy: copied again */
  uint64_t copies_discarded;        /* copies that did not validate */
  uint64_t pauses_detected;         /* this host's clock stood still: leases dropped */
  uint64_t rejoins_after_fence;     /* fenced by the owner (no heartbeat for host_ttl) */
  uint64_t ack_waits;               /* acquires that waited for the owner's acknowledgement */
} cxlkv_lease_stats;
int cxlkv_domain_lease_stats(cxlkv_domain* d, cxlkv_lease_stats* out);
/* cxlkv_block_invalidate — for zero-copy readers (a kernel or a GPU copy reading the block
 * in place): checks the lease's deadline and the block as above, invalidates the range and
 * stores its address in *addr. A zero-copy reader must, in this order:
 *   1. acquire the lease (cxlkv_lease_acquire / cxlkv_lease_acquire_chain);
 *   2. call cxlkv_block_invalidate over every byte it will read — after the lease, never
 *      before it (lines fetched earlier may be an earlier generation's), and again after
 *      each new acquisition of the same block;
 *   3. read through *addr only, and never after lease->deadline_ms (renew before it);
 *   4. cxlkv_lease_validate before using anything computed from what it read: on
 *      CXLKV_E_STALE discard it all;
 *   5. if it reads again after that validation (a long-running kernel, a second pass),
 *      validate again after its last read before using those results;
 *   6. release the lease only after its last read. */
int cxlkv_block_invalidate(cxlkv_domain* d, const cxlkv_arena* arena, const cxlkv_lease* lease,
                           uint64_t offset, size_t len, const void** addr);

/* Region objects: entries the owner publishes itself for objects in a region of the pool no
 * host's arena holds (the LMCache coordinator's region, docs/lmcache.md "Keys in the domain's
 * index"). Found and leased like any block (cxlkv_lease_acquire_chain with their keys); the
 * lease's ref is then a region ref. cxlkv_region_object decodes it: the object's offset in the
 * region, its length, its generation (LMCache's handle) and the region's tag (LMCache's: the
 * CRC32C of region_id); CXLKV_E_INVALID for an arena block's ref. Any output may be NULL.
 * cxlkv_lease_copy_out_region is cxlkv_lease_copy_out for such a lease: `region` is where this
 * process maps the region (region_bytes long); copies [offset, offset + len) of the object
 * into dst after invalidating it, then validates the lease (kept for the copy and updated in
 * place, as cxlkv_lease_copy_out's). CXLKV_E_STALE: discard dst (as
 * cxlkv_lease_copy_out); CXLKV_E_INVALID: not a region object, or a range outside the object
 * or the region. */
int cxlkv_region_object(const cxlkv_block_ref* ref, uint64_t* offset, uint64_t* length,
                        uint64_t* generation, uint32_t* region_tag);
int cxlkv_lease_copy_out_region(cxlkv_domain* d, cxlkv_lease* lease, const void* region,
                                uint64_t region_bytes, uint64_t offset, void* dst, size_t len);

/* The owner role: one per domain. cxlkv_owner_step applies requests, fences, evicts and
 * reclaims; call it every few milliseconds. */
int cxlkv_owner_open(const char* spec, cxlkv_owner** out);
void cxlkv_owner_step(cxlkv_owner* o);
void cxlkv_owner_close(cxlkv_owner* o);

/* ---- GPU access: registered arenas and block copies (gpu/, docs/gpu.md) ------------------
 *
 * A cxlkv_gpu is one CUDA device with a registration thread and a copy engine (two streams).
 * cxlkv_gpu_open fails with CXLKV_E_NO_CUDA when libcxlkv was built without the CUDA
 * toolkit, and CXLKV_E_NO_DEVICE when the machine has no (such) CUDA device; every other
 * cxlkv_gpu_* function then has nothing to work on. A handle may be used from any thread;
 * calls make the device current on the calling thread.
 *
 * Registration pins a whole arena (never single blocks) with cudaHostRegister
 * (Portable | Mapped) in chunks of at most 64 GiB on the registration thread: it starts at
 * once and completes in the background; poll or wait for it before copying from the arena.
 * Pinned pages stay DMA targets whatever happens to the mapping, so a registration ends by
 * itself before its arena's memory is given away — the arena closed or shrunk, or its extent
 * revoked: the handle's queued copies are drained, the registration is unpinned, and later
 * copies naming its blocks fail with CXLKV_E_NOT_FOUND (a revoked arena cannot be registered:
 * CXLKV_E_REVOKED). Zero-copy kernels still reading it then fault rather than reach memory
 * that is no longer this host's: stop them before an extent may leave.
 *
 * The device side is a paged KV cache described by cxlkv_gpu_cache: page p, layer l, part k
 * (k < kv_parts; 2 when K and V are apart) lies at
 *     layer_base[l] + k * kv_stride_bytes + p * page_stride_bytes,   chunk_bytes long,
 * and in a host block at (l * kv_parts + k) * chunk_bytes. Contiguous pages (Dynamo KVBM
 * "fully contiguous"): layer_base[l] = base + l * kv_parts * chunk_bytes, kv_stride =
 * chunk_bytes, page_stride = layers * kv_parts * chunk_bytes. vLLM per-layer tensors
 * [2][pages][chunk]: layer_base[l] = tensor l, kv_parts 2, page_stride = chunk_bytes,
 * kv_stride = pages * chunk_bytes. */

typedef struct cxlkv_gpu cxlkv_gpu;

int cxlkv_gpu_open(int device, cxlkv_gpu** out);

/* Bytes a device-to-host copy writes into arena blocks can sit dirty in this host's cache on
 * platforms whose PCIe writes allocate in the last-level cache (Intel "Allocating Write
 * Flows", the default on Granite Rapids; DDIO on earlier Xeons), where another host reading
 * the CXL memory cannot see them. By default (CXLKV_GPU_DMA_WRITE_BACK) the copy engine
 * writes those lines back (clwb/clflushopt + sfence) once the copy is done, before
 * cxlkv_gpu_poll / cxlkv_gpu_wait report it: a block copied back from the GPU may be
 * published as soon as its ticket completes. CXLKV_GPU_DMA_PLATFORM_WRITES_MEMORY states that
 * every host of the domain has that BIOS setting off (DMA writes go to memory) and skips the
 * write-back (docs/gpu.md). */
enum { CXLKV_GPU_DMA_WRITE_BACK = 0, CXLKV_GPU_DMA_PLATFORM_WRITES_MEMORY = 1 };
typedef struct cxlkv_gpu_options {
  uint32_t dma_writeback; /* CXLKV_GPU_DMA_* */
  uint32_t reserved;      /* 0 */
} cxlkv_gpu_options;
/* cxlkv_gpu_open with options (NULL: the defaults). An unknown dma_writeback or a nonzero
 * reserved field is CXLKV_E_INVALID. */
int cxlkv_gpu_open_with(int device, const cxlkv_gpu_options* options, cxlkv_gpu** out);
/* Waits for queued copies, unregisters everything, frees the streams. */
void cxlkv_gpu_close(cxlkv_gpu* gpu);

enum {
  CXLKV_GPU_QUEUED = 0,
  CXLKV_GPU_REGISTERING = 1,
  CXLKV_GPU_REGISTERED = 2,
  CXLKV_GPU_FAILED = 3,
};

typedef struct cxlkv_gpu_registration_stats {
  uint64_t bytes;
  uint64_t bytes_done;
  uint32_t chunks;
  uint32_t chunks_done;
  uint32_t state;     /* CXLKV_GPU_QUEUED.. */
  uint32_t reserved;
  int64_t elapsed_ns; /* since the registration was queued (until it finished) */
  double ns_per_gib;  /* time inside cudaHostRegister per GiB pinned */
} cxlkv_gpu_registration_stats;

/* Queues the whole arena for registration; *registration names it. CXLKV_E_EXISTS: this
 * arena is already registered; CXLKV_E_MISMATCH: it overlaps another registration. */
int cxlkv_gpu_register(cxlkv_gpu* gpu, const cxlkv_arena* arena, uint64_t* registration);
/* 0: registered; CXLKV_E_PENDING: still pinning; else why it failed (CXLKV_E_CUDA when the
 * driver refused the mapping: cxlkv_last_error() names the source, its type and the fix).
 * stats may be NULL. */
int cxlkv_gpu_register_poll(cxlkv_gpu* gpu, uint64_t registration,
                            cxlkv_gpu_registration_stats* stats);
int cxlkv_gpu_register_wait(cxlkv_gpu* gpu, uint64_t registration);
int cxlkv_gpu_unregister(cxlkv_gpu* gpu, uint64_t registration);
/* Zero-copy: the device address of registered host memory, for kernels that read blocks
 * in place. CXLKV_E_NOT_FOUND: not registered; CXLKV_E_PENDING: registration not done. */
int cxlkv_gpu_device_pointer(cxlkv_gpu* gpu, const void* host, void** device);

typedef struct cxlkv_gpu_cache {
  uint32_t layers;
  uint32_t kv_parts;   /* 1: K and V together in a chunk; 2: apart */
  uint32_t page_count;
  uint32_t reserved;
  uint64_t chunk_bytes; /* multiple of 16 */
  uint64_t page_stride_bytes;
  uint64_t kv_stride_bytes;
  const uint64_t* layer_base; /* `layers` device addresses */
} cxlkv_gpu_cache;

typedef struct cxlkv_gpu_block {
  void* host;    /* the block's address in this process, inside a registered arena */
  uint32_t page; /* its page in the device cache */
  uint32_t reserved;
} cxlkv_gpu_block;

#define CXLKV_GPU_TO_DEVICE 0
#define CXLKV_GPU_TO_HOST 1
#define CXLKV_GPU_KERNEL 1u /* flag: one gather/scatter kernel launch instead of DMA copies */

/* Queues the copies of n blocks, layers [layer_begin, layer_end) (both 0: all), and returns
 * a ticket. Contiguous pieces are coalesced; without CXLKV_GPU_KERNEL each copy is one
 * cudaMemcpyAsync. Nothing is queued when the list is invalid (CXLKV_E_INVALID names the
 * entry: a page written twice, a page out of range, an unaligned block, overlapping host
 * blocks on the way back) or a block is outside a finished registration
 * (CXLKV_E_NOT_FOUND / CXLKV_E_PENDING). Host-to-device copies run in submission order, as
 * do device-to-host copies; submit layer by layer for a layer-wise pipeline. */
int cxlkv_gpu_copy_blocks(cxlkv_gpu* gpu, const cxlkv_gpu_cache* cache, int direction,
                          const cxlkv_gpu_block* blocks, size_t n, uint32_t layer_begin,
                          uint32_t layer_end, uint32_t flags, uint64_t* ticket);
/* 0: the ticket's copies are done; CXLKV_E_PENDING: still running; else the failure. */
int cxlkv_gpu_poll(cxlkv_gpu* gpu, uint64_t ticket);
int cxlkv_gpu_wait(cxlkv_gpu* gpu, uint64_t ticket);
/* Makes a CUDA stream (a cudaStream_t) wait for a ticket on the device: the compute of
 * layer i waits for layer i's copy only. */
int cxlkv_gpu_stream_wait(cxlkv_gpu* gpu, uint64_t ticket, void* cuda_stream);

/* ---- Tiering: CXL and NVMe under the placement rule (docs/tier-capi.md) -----------------
 *
 * A cxlkv_tier keeps KV blocks of one size class of an arena (the CXL tier) and an NVMe
 * store (O_DIRECT slot files on io_uring, in a directory on a local file system) and moves
 * them between the two by the placement rule (docs/placement.md): each block is kept in
 * CXL, written to NVMe, or dropped (recomputing it is cheaper than any fetch), from its size,
 * its expected reuse interval (learned from cxlkv_tier_use, else its namespace's prior, else
 * its chain's ancestors), the prefill tokens a hit saves, the GPU's prefill queue and the
 * CXL tier's occupancy and retention. Above the high watermark the least recently used
 * unpinned CXL blocks leave CXL until the low watermark, each re-decided by the rule (NVMe,
 * or drop); a block demoted less than the cool-down ago is not promoted back (anti-thrash).
 * The rule's parameters come from the [placement] table of a domain.toml
 * (orchestrator/domain.example.toml lists the keys), or its defaults.
 *
 * Keys are cxlkv_prefix_key values (cxlkv_prefix_key_chain, cxlkv_prefix_key_from_digest),
 * unique within the tier. Every call that takes keys acts on each key on its own and reports
 * per key in `results` (may be NULL): a CXLKV_TIER_* residence (>= 0) or a CXLKV_E_* code
 * (< 0); it returns 0 when every key succeeded, else the first key's error (its message in
 * cxlkv_last_error()). A NULL tier or key array, or a `len` that is not the tier's block size
 * (cxlkv_tier_block_size), is CXLKV_E_INVALID before any key is looked at.
 *
 * Thread-safety: a tier may be used from any number of threads at once. The rule's state
 * (reuse history, decisions) is behind one lock per tier; NVMe I/O runs outside it. There is
 * no background thread: NVMe completions are reaped by the threads in cxlkv_tier_read,
 * cxlkv_tier_prefetch_poll / _wait and the other calls that wait for I/O.
 * Ownership and lifetime: the tier borrows its arena (close the tier first). Blocks the tier
 * holds are allocated in the arena's size class by this process (cxlkv_arena_stats counts
 * them; never cxlkv_free them) and return to the arena when the tier closes; blocks on NVMe
 * survive: a tier opened later on the same directory finds them again (CXLKV_TIER_ON_NVME).
 * If the arena is closed (or its extent revoked or shrunk) while the tier is open, the tier
 * ends with it: NVMe I/O is drained, its CXL blocks are freed, and every later call fails with
 * CXLKV_E_INVALID ("closed") — cxlkv_tier_close must still be called. */

typedef struct cxlkv_tier cxlkv_tier;

/* Where a key's block is. CXLKV_TIER_DROPPED only in results of a placement (the rule sent
 * the block nowhere: recompute it when needed). */
enum {
  CXLKV_TIER_MISSING = 0,   /* not held by the tier */
  CXLKV_TIER_IN_CXL = 1,    /* in the arena; cxlkv_tier_lookup gives its address */
  CXLKV_TIER_ON_NVME = 2,   /* only on NVMe */
  CXLKV_TIER_DEMOTING = 3,  /* in flight: being written to NVMe */
  CXLKV_TIER_PROMOTING = 4, /* in flight: being read back into CXL */
  CXLKV_TIER_DROPPED = 5,
};

/* Which of the rule's two CXL tiers the arena is (their prices and speeds differ). */
enum {
  CXLKV_TIER_CXL_EXPANDED = 0, /* a CXL memory expander in this host (the default) */
  CXLKV_TIER_CXL_POOLED = 1,   /* switch-attached memory pooled across hosts */
};

#define CXLKV_TIER_NVME_DSYNC 1u /* open: every NVMe write is on stable media when it completes */
/* open: how NVMe reads reach CXL blocks. By default the store measures at open whether its
 * disk reads faster into 2 MiB pages than into 4 KiB ones (emulated disks: virtio-blk, QEMU
 * NVMe) and then stages reads through its own 2 MiB-page buffers; a device-dax arena is
 * always read directly. These force one way (both together: CXLKV_E_INVALID). */
#define CXLKV_TIER_NVME_STAGE_READS 2u
#define CXLKV_TIER_NVME_DIRECT_READS 4u

typedef struct cxlkv_tier_options {
  uint32_t size_class; /* the arena's size class the tier keeps blocks of */
  uint32_t cxl_kind;   /* CXLKV_TIER_CXL_EXPANDED or CXLKV_TIER_CXL_POOLED */
  /* The CXL capacity the occupancy and the watermarks count against, in blocks; 0: every
   * block of the class. Keep some blocks beyond the high watermark free: promotions and
   * blocks on their way to NVMe pass through CXL. */
  uint64_t cxl_blocks;
  const char* nvme_dir; /* the NVMe store's directory (created if missing); required */
  /* At most this many blocks only on NVMe; past it the least recently used are deleted.
   * 0: no limit but nvme_bytes. */
  uint64_t nvme_blocks;
  /* Limit on the store's slot file in bytes; 0: room for nvme_blocks (with slack for slots
   * being retired), or the file system's free space when nvme_blocks is 0 too. */
  uint64_t nvme_bytes;
  /* A domain.toml whose [placement] table configures the rule (other tables are ignored;
   * placement.calibration, when set, replaces the figures it measured); NULL: the defaults. */
  const char* config_path;
  uint32_t nvme_queue_depth; /* io_uring entries, the most NVMe I/Os in flight; 0: 64 */
  uint32_t flags;            /* CXLKV_TIER_NVME_DSYNC, CXLKV_TIER_NVME_{STAGE,DIRECT}_READS */
} cxlkv_tier_options;

/* Opens a tier over `arena` (one tier per size class of an arena) and the store in
 * o->nvme_dir. Errors name the field and the fix: CXLKV_E_INVALID for a size class or
 * cxl_kind out of range, a cxl_blocks larger than the class, a bad config key ("<path>:<line>:
 * key 'placement.<key>': <what>"), a store whose block size differs from the class's;
 * CXLKV_E_NOT_FOUND for a config or calibration file that is missing; CXLKV_E_EXISTS when
 * the class already has a tier; CXLKV_E_MISMATCH for a store directory on a file system
 * without O_DIRECT or in use by another tier or process; CXLKV_E_PERMISSION; CXLKV_E_REVOKED. */
int cxlkv_tier_open(cxlkv_arena* arena, const cxlkv_tier_options* o, cxlkv_tier** out);
/* Waits for NVMe I/O in flight (prefetches included: their tickets are gone), frees the
 * tier's CXL blocks (their data is lost; demote first what must survive) and closes the
 * store. NULL is ignored. No other call on the tier may be running or follow. */
void cxlkv_tier_close(cxlkv_tier* t);
/* The tier's block size in bytes (every `len` below); 0 for NULL or a closed tier. */
uint64_t cxlkv_tier_block_size(const cxlkv_tier* t);

/* What the rule is told about the blocks of one call: one request's chain of keys. The call
 * acts on chain[first..n); the keys before a block in the chain are its ancestors (a block
 * with no reuse history of its own may take the nearest ancestor's). */
typedef struct cxlkv_tier_request {
  uint64_t ns;                   /* the keys' namespace (cxlkv_namespace) */
  const cxlkv_prefix_key* chain; /* the request's keys, root first */
  size_t n;                      /* keys in chain */
  size_t first;                  /* first key acted on; < n */
  uint32_t tokens;      /* prefill tokens one block's hit saves; 0: the class's tokens per block */
  uint32_t queue_depth; /* prefills queued on the GPU now (they would wait behind a recompute) */
  int32_t pin;          /* the namespace's pin level ([[namespace]] pin), 0..3; 0: none */
  uint32_t flags;       /* CXLKV_TIER_RECORD_USE, CXLKV_TIER_PREFETCH_FORCE */
} cxlkv_tier_request;

/* place: record a use of each placed block first (a block this request produced and did not
 * pass to cxlkv_tier_use). */
#define CXLKV_TIER_RECORD_USE 1u
/* prefetch: promote every NVMe block asked for, whatever the rule says (cool-down still
 * applies: CXLKV_E_BUSY). */
#define CXLKV_TIER_PREFETCH_FORCE 2u

/* Records that the request uses chain[first..n) now — the rule's only source of reuse
 * history, so call it once per request, for the blocks it looked up (hits and misses alike),
 * or for those it hit, with the produced ones recorded by place (CXLKV_TIER_RECORD_USE) —
 * and marks those blocks most recently used in their tier, the root most (a chain is useful
 * only up to its first missing block, so its tail leaves CXL first). Keys not held are
 * recorded too. Cost: a few hundred ns per key. */
int cxlkv_tier_use(cxlkv_tier* t, const cxlkv_tier_request* r);

/* Places new blocks: chain[first + i] from data[i] (len bytes, the tier's block size), each
 * where the rule decides — CXL (copied into a new block with non-temporal stores), NVMe (the
 * NVMe-bound blocks of the call are written in one batch, staged through CXL blocks) or
 * nowhere. results[i] (n - first entries, may be NULL): CXLKV_TIER_IN_CXL / _ON_NVME /
 * _DROPPED, or, for a key the tier already holds, its residence (the data is not copied);
 * a block whose NVMe write failed stays in CXL (CXLKV_TIER_IN_CXL; the failure is in
 * cxlkv_tier_explain). CXLKV_E_FULL: no free block in the class to hold or stage it. The
 * watermarks run after each block kept in CXL; the chain is then marked used root first. */
int cxlkv_tier_place(cxlkv_tier* t, const cxlkv_tier_request* r, const void* const* data,
                     size_t len, int* results);
/* As cxlkv_tier_place, for blocks the caller allocated in the tier's arena and size class
 * (cxlkv_alloc) and filled itself (a GPU copy into CXL, say): refs[i] holds chain[first + i].
 * Every ref is checked first (CXLKV_E_FOREIGN: another arena or class; CXLKV_E_STALE: not
 * allocated; CXLKV_E_INVALID: the same block twice) and nothing is taken if one fails;
 * otherwise every block is the tier's from then on: kept in place, written to NVMe and freed,
 * or freed (dropped, or the key was already held). */
int cxlkv_tier_place_blocks(cxlkv_tier* t, const cxlkv_tier_request* r, const cxlkv_block_ref* refs,
                            int* results);

typedef struct cxlkv_tier_location {
  int32_t residence;   /* CXLKV_TIER_MISSING .. CXLKV_TIER_PROMOTING */
  uint32_t reserved;   /* 0 */
  void* addr;          /* CXLKV_TIER_IN_CXL: the block's address in this process, else NULL */
  cxlkv_block_ref ref; /* CXLKV_TIER_IN_CXL: the block, else zero */
} cxlkv_tier_location;

/* Where each of n keys is now, into out[0..n). A CXL address stays valid only while the
 * block stays in CXL (the watermarks may demote it at any time): pin it with
 * cxlkv_tier_acquire to read it in place. Records no use. Always 0 for valid arguments. */
int cxlkv_tier_lookup(cxlkv_tier* t, const cxlkv_prefix_key* keys, size_t n,
                      cxlkv_tier_location* out);
/* Pins a CXL-resident block (no demotion, no drop) and marks it most recently used; *addr and
 * *ref (each may be NULL) get it. Pins count: release as often as acquired.
 * CXLKV_E_NOT_FOUND: not held; CXLKV_E_BUSY: on NVMe or in flight (prefetch it first). */
int cxlkv_tier_acquire(cxlkv_tier* t, const cxlkv_prefix_key* key, void** addr,
                       cxlkv_block_ref* ref);
int cxlkv_tier_release(cxlkv_tier* t, const cxlkv_prefix_key* key);

/* Copies each key's block into dsts[i] (len bytes, the tier's block size) from where it is:
 * a pinned copy from CXL, or one NVMe batch read for those on NVMe (no promotion; 4 KiB
 * aligned buffers are read into directly). Waits for I/O in flight on a key (up to 10 s, then
 * CXLKV_E_BUSY). results[i]: the residence it was read from, or CXLKV_E_NOT_FOUND (not
 * held), CXLKV_E_CORRUPT (the NVMe copy failed its checksums and is dropped: recompute it).
 * Bytes read equal the bytes placed, whatever moves happened between. Records no use. */
int cxlkv_tier_read(cxlkv_tier* t, const cxlkv_prefix_key* keys, size_t n, void* const* dsts,
                    size_t len, int* results);

/* Starts promoting chain[first..n) from NVMe back into CXL, one NVMe submission, and returns
 * at once with a ticket. For each NVMe block the rule decides first, as for a new placement:
 * only blocks it would keep in CXL, and not cooling down, are promoted; the others stay on
 * NVMe (read them with cxlkv_tier_read). CXLKV_TIER_PREFETCH_FORCE promotes every NVMe block
 * the cool-down allows. Records no use. */
int cxlkv_tier_prefetch(cxlkv_tier* t, const cxlkv_tier_request* r, uint64_t* ticket);
/* 0 once the ticket's reads are done (the ticket is then gone), CXLKV_E_PENDING while they
 * run (reaps completed I/O, never blocks), CXLKV_E_NOT_FOUND for an unknown or finished
 * ticket. results (n - first entries, may be NULL, filled when done): CXLKV_TIER_IN_CXL
 * (promoted, or already there), CXLKV_TIER_ON_NVME (the rule or the cool-down kept it
 * there), CXLKV_TIER_DEMOTING / _PROMOTING (in flight when asked: look again later),
 * CXLKV_TIER_MISSING, or an error — CXLKV_E_FULL (no free CXL block), CXLKV_E_BUSY (cooling
 * down, with CXLKV_TIER_PREFETCH_FORCE), CXLKV_E_CORRUPT (the NVMe copy failed its checks and
 * is dropped: recompute it). Returns 0 even when some keys failed (the last error names the
 * first): check results. Every ticket must be collected (or the tier closed). The watermarks
 * run when the ticket finishes. */
int cxlkv_tier_prefetch_poll(cxlkv_tier* t, uint64_t ticket, int* results);
/* As poll, blocking until the reads are done. */
int cxlkv_tier_prefetch_wait(cxlkv_tier* t, uint64_t ticket, int* results);

/* Writes CXL blocks to NVMe (one batch) and frees their CXL copies; the cool-down starts.
 * results[i]: CXLKV_TIER_ON_NVME (demoted, or already there), CXLKV_E_NOT_FOUND,
 * CXLKV_E_BUSY (pinned or in flight), or the write's error (CXLKV_E_FULL: the store is full;
 * the block then stays in CXL, nothing is lost). */
int cxlkv_tier_demote(cxlkv_tier* t, const cxlkv_prefix_key* keys, size_t n, int* results);
/* Forgets blocks wherever they are (CXL block freed, NVMe copy deleted). results[i]:
 * CXLKV_TIER_MISSING, or CXLKV_E_NOT_FOUND, CXLKV_E_BUSY (pinned or in flight). */
int cxlkv_tier_drop(cxlkv_tier* t, const cxlkv_prefix_key* keys, size_t n, int* results);

#define CXLKV_TIER_EXPLAIN_JSON 1u /* explain: one JSON object instead of text */

/* Why `key` is where it is: its residence (NVMe file and offset, or CXL block), whether a
 * promotion would be allowed now (cool-down), its reuse history, the last move the tier made
 * of it (placement, demotion as a watermark victim or by the caller, promotion, a failed
 * NVMe write) with the rule's inputs and verdict then — every figure and the clause that
 * decided — and the rule's verdict if it were decided now. For a key the tier does not hold,
 * its last move if it was dropped recently, and its reuse history. Text (several lines) or,
 * with CXLKV_TIER_EXPLAIN_JSON, one JSON object (keys in docs/tier-capi.md). Writes at most
 * len bytes including the NUL into buf; *needed (may be NULL) gets the full size including
 * the NUL. buf NULL and len 0: only *needed (returns 0). CXLKV_E_INVALID when len is too
 * small (buf then holds the truncated start). */
int cxlkv_tier_explain(cxlkv_tier* t, const cxlkv_prefix_key* key, uint32_t flags, char* buf,
                       size_t len, size_t* needed);

typedef struct cxlkv_tier_stats {
  uint64_t block_bytes;
  /* CXL capacity (options.cxl_blocks, or the class's blocks) and the watermarks in blocks
   * (placement.high_watermark / low_watermark of it) */
  uint64_t cxl_capacity_blocks;
  uint64_t high_watermark_blocks;
  uint64_t low_watermark_blocks;
  /* Held now: in CXL (including blocks being demoted), only on NVMe (including blocks being
   * promoted). */
  uint64_t cxl_blocks;
  uint64_t nvme_blocks;
  /* Placements: new blocks by where the rule sent them; keys already held; blocks kept in
   * CXL because their NVMe write failed. */
  uint64_t placed_cxl;
  uint64_t placed_nvme;
  uint64_t placed_dropped;
  uint64_t already_held;
  uint64_t nvme_write_failures;
  /* Moves: CXL -> NVMe (the watermarks and cxlkv_tier_demote), NVMe -> CXL, promotions the
   * cool-down refused, prefetched NVMe blocks the rule left on NVMe. */
  uint64_t demotions;
  uint64_t demotion_failures;
  uint64_t promotions;
  uint64_t promotion_failures;
  uint64_t promotions_refused;
  uint64_t prefetch_kept;
  /* Watermark runs, and their victims the rule dropped instead of demoting. */
  uint64_t watermark_runs;
  uint64_t victims_dropped;
  /* Blocks deleted past nvme_blocks; blocks forgotten (cxlkv_tier_drop, victims dropped,
   * NVMe copies that failed their checks). */
  uint64_t nvme_evicted;
  uint64_t dropped;
  /* Blocks copied out by cxlkv_tier_read, from each tier; uses recorded. */
  uint64_t cxl_reads;
  uint64_t nvme_reads;
  uint64_t uses;
  /* Rule decisions (placements, prefetches, victims); those whose reuse interval came from
   * the namespace's prior, or from an ancestor in the chain; and by clause: pinned,
   * recompute-cheaper, below-break-even, ttft-forced, cxl-full, above-break-even. */
  uint64_t decisions;
  uint64_t from_prior;
  uint64_t from_ancestor;
  uint64_t clauses[6];
  /* The store's slot file; NVMe blocks dropped because a read failed its checks. */
  uint64_t nvme_file_bytes;
  uint64_t nvme_data_loss;
  /* How long an unused block lasts in CXL before the watermarks evict it (+inf until they
   * first do); the rule's break-even reuse interval for one block at the occupancy now. */
  double retention_s;
  double break_even_s;
} cxlkv_tier_stats;

int cxlkv_tier_stats_get(cxlkv_tier* t, cxlkv_tier_stats* stats);

/* ---- the cross-domain prefix directory (docs/ha.md) ----
 * Which CXL domains may hold the prefix whose chain key is `key` (the key of its last block:
 * cxlkv_prefix_key_chain, cxlkv_prefix_key_from_digest). Asked of an orchestrator that runs
 * with [etcd] (leader or standby, of any domain: the directory covers the etcd cluster):
 * `orchestrators` is a socket path, unix:PATH or tcp:HOST:PORT, several separated by commas
 * (tried in order). The answer comes from Bloom filters: a domain reported may hold the prefix
 * (false positives at the rate each reports), a domain not reported does not hold it (as of
 * its leader's last summary, at most directory.min_interval_ms old while it lives). Writes one
 * JSON object into buf:
 *   {"may_hold":["a",...], "revision":N, "domains":[{"domain":"a","may_hold":true,
 *    "anchor":true,"published":N,"fp_rate":F,"epoch":N,"age_ms":N,"filter_bytes":N,
 *    "keyed":false,"key_held":true},...]}
 * A domain publishes keyed keys ("keyed":true) unless keys.unkeyed is set; when the answering
 * orchestrator lacks its secret, "key_held" is false and "may_hold" false: cannot tell
 * (docs/kv_events.md, "What a subscriber can learn").
 * buf/len/needed as cxlkv_tier_explain. CXLKV_E_INVALID for a bad endpoint or a short buffer;
 * the orchestrator's error otherwise (cxlkv_last_error names it: no [etcd] there, etcd
 * unreadable, nobody answering). Makes one RPC; thread-safe. */
int cxlkv_directory_where(const char* orchestrators, const cxlkv_prefix_key* key, char* buf,
                          size_t len, size_t* needed);

const char* cxlkv_strerror(int code);
const char* cxlkv_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* CXLKV_CXLKV_H_ */
