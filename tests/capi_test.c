/* A C program using only include/cxlkv/cxlkv.h. Exits 0 when every check passes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cxlkv/cxlkv.h"

static int failures = 0;
#define CHECK(cond)                                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, #cond, \
              cxlkv_last_error());                                                            \
      ++failures;                                                                             \
    }                                                                                         \
  } while (0)

int main(void) {
  cxlkv_pool* pool = NULL;
  CHECK(cxlkv_pool_open("nvme:/dev/nvme0n1", &pool) == CXLKV_E_INVALID);
  CHECK(strstr(cxlkv_last_error(), "accepted forms") != NULL);
  CHECK(cxlkv_pool_open("file:/dev/shm/cxlkv-capi-missing", &pool) == CXLKV_E_NOT_FOUND);

  CHECK(cxlkv_pool_open("memfd:capi?size=16M", &pool) == CXLKV_OK);
  cxlkv_arena* arena = NULL;
  CHECK(cxlkv_arena_open(pool, NULL, &arena) == CXLKV_E_NOT_FOUND); /* blank region */

  cxlkv_arena_options opt;
  memset(&opt, 0, sizeof(opt));
  opt.layout = (cxlkv_kv_layout){2, 2, 64, 2, 16, 0}; /* 2*2*2*64*2*16 = 16 KiB blocks */
  opt.class_tokens[0] = 16;
  opt.class_tokens[1] = 64;
  CHECK(cxlkv_arena_create(pool, &opt, &arena) == CXLKV_OK);
  CHECK(cxlkv_block_size(arena, 0) == 16384);
  CHECK(cxlkv_block_size(arena, 1) == 65536);
  CHECK(cxlkv_block_size(arena, 2) == 0);

  cxlkv_block_ref ref;
  void* addr = NULL;
  CHECK(cxlkv_alloc(arena, 0, &ref, &addr) == CXLKV_OK);
  char msg[64] = "prefix block 0";
  cxlkv_copy_to_block(addr, msg, sizeof(msg));
  void* back = NULL;
  CHECK(cxlkv_ref_to_addr(arena, &ref, &back) == CXLKV_OK && back == addr);
  CHECK(memcmp(back, msg, sizeof(msg)) == 0);
  cxlkv_block_ref ref2;
  CHECK(cxlkv_addr_to_ref(arena, addr, &ref2) == CXLKV_OK);
  CHECK(memcmp(&ref, &ref2, sizeof(ref)) == 0);
  CHECK(cxlkv_alloc(arena, 9, &ref2, NULL) == CXLKV_E_INVALID);

  CHECK(cxlkv_free(arena, &ref) == CXLKV_OK);
  CHECK(cxlkv_free(arena, &ref) == CXLKV_E_DOUBLE_FREE);
  CHECK(cxlkv_ref_to_addr(arena, &ref, &back) == CXLKV_E_STALE);
  cxlkv_block_ref foreign = ref;
  foreign.arena_uuid[3] ^= 0xFF;
  CHECK(cxlkv_free(arena, &foreign) == CXLKV_E_FOREIGN);

  enum { N = 100 };
  cxlkv_block_ref refs[N];
  void* addrs[N];
  CHECK(cxlkv_alloc_bulk(arena, 1, N, refs, addrs) == CXLKV_OK);
  cxlkv_arena_stats st;
  CHECK(cxlkv_arena_stats_get(arena, &st) == CXLKV_OK);
  CHECK(st.class_count == 2);
  CHECK(st.classes[1].allocated_blocks == N);
  CHECK(st.classes[0].allocs == 1 && st.classes[0].frees == 1);
  CHECK(st.bad_frees == 1); /* the double free; the foreign ref is refused before */
  CHECK(st.metadata_bytes * 1000 < st.region_bytes * 5);
  CHECK(cxlkv_alloc_bulk(arena, 1, 100000, refs, NULL) == CXLKV_E_FULL);
  CHECK(strstr(cxlkv_last_error(), "full") != NULL);
  CHECK(cxlkv_free_bulk(arena, refs, N) == CXLKV_OK);

  /* A second arena on the same pool is refused while the first is open. */
  cxlkv_arena* second = NULL;
  CHECK(cxlkv_arena_open(pool, NULL, &second) == CXLKV_E_MISMATCH);
  cxlkv_arena_close(arena);
  cxlkv_pool_close(pool);

  CHECK(strcmp(cxlkv_strerror(CXLKV_E_FULL), "no space left") == 0);
  if (failures != 0) {
    fprintf(stderr, "%d check(s) failed\n", failures);
    return 1;
  }
  printf("capi_test: all checks passed\n");
  return 0;
}
