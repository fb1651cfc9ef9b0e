/* cxlkv.h — the stable C API of cxlkv: CXL memory pools, KV arenas and the KV block allocator.
 *
 * Objects
 *   cxlkv_pool   one opened memory source, named by a spec string:
 *                  "devdax:/dev/dax0.0", "kmem:node=2", "file:/dev/shm/kv?size=8G",
 *                  "memfd:?size=1G"
 *   cxlkv_arena  a KV arena formatted in a pool, with its block allocator. One arena per pool.
 *   cxlkv_block_ref  (arena uuid, index, generation): names one allocation of a block; valid
 *                in every process that maps the arena, stale once the block is freed.
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

const char* cxlkv_strerror(int code);
const char* cxlkv_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* CXLKV_CXLKV_H_ */
