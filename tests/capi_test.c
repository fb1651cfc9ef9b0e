/* A C program using only include/cxlkv/cxlkv.h. Exits 0 when every check passes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* FNV-1a over n bytes: the copy-out checks compare the bytes read with the bytes written. */
static uint64_t Checksum(const void* p, size_t n) {
  const unsigned char* b = (const unsigned char*)p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

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

  /* Shared prefix blocks: an owner, two hosts, a block published by one, leased by the other. */
  {
    char dspec[128];
    cxlkv_domain_geometry g;
    memset(&g, 0, sizeof(g));
    g.max_hosts = 4;
    g.index_entries = 64;
    uint64_t bytes = (cxlkv_domain_bytes(&g) + 4095) / 4096 * 4096;
    snprintf(dspec, sizeof(dspec), "file:/dev/shm/cxlkv-capi-domain-%d?size=%llu", (int)getpid(),
             (unsigned long long)bytes);
    CHECK(cxlkv_domain_format(dspec, &g) == CXLKV_OK);
    char* q = strchr(dspec, '?');
    *q = 0; /* reopen the file at its size */
    cxlkv_owner* owner = NULL;
    cxlkv_domain *a = NULL, *b = NULL;
    CHECK(cxlkv_owner_open(dspec, &owner) == CXLKV_OK);
    CHECK(cxlkv_domain_join(dspec, 0, &a) == CXLKV_OK);
    CHECK(cxlkv_domain_join(dspec, 1, &b) == CXLKV_OK);
    CHECK(cxlkv_domain_join(dspec, 9, &b) == CXLKV_E_INVALID); /* no such host row */
    uint64_t ns = cxlkv_namespace("tenant", "llama3-70b", "L=2,H=2,D=64,B=2,T=16");
    uint32_t tokens[16];
    for (int i = 0; i < 16; ++i) tokens[i] = 1000 + i;
    cxlkv_prefix_key key = cxlkv_prefix_key_chain(ns, NULL, tokens, 16);
    cxlkv_block_ref blk;
    void* p = NULL;
    CHECK(cxlkv_alloc(arena, 0, &blk, &p) == CXLKV_OK);
    cxlkv_copy_to_block(p, "system prompt KV", 17);
    CHECK(cxlkv_prefix_publish(a, ns, &key, NULL, arena, &blk) == CXLKV_OK);
    cxlkv_owner_step(owner); /* applies the publication, acknowledges both hosts */
    cxlkv_prefix_hit hit;
    CHECK(cxlkv_prefix_lookup(b, ns, &key, &hit) == CXLKV_OK);
    CHECK(hit.publisher == 0 && hit.ref.index == blk.index);
    CHECK(cxlkv_prefix_lookup(b, cxlkv_namespace("other", "llama3-70b", "x"), &key, &hit) ==
          CXLKV_E_NOT_FOUND);
    CHECK(cxlkv_prefix_lookup(b, ns, &key, &hit) == CXLKV_OK);
    cxlkv_lease lease;
    CHECK(cxlkv_domain_heartbeat(b, NULL, NULL) == CXLKV_OK);
    CHECK(cxlkv_lease_acquire(b, &hit, &lease) == CXLKV_OK);
    void* data = NULL;
    CHECK(cxlkv_ref_to_addr(arena, &lease.ref, &data) == CXLKV_OK);
    char copy[17];
    memcpy(copy, data, sizeof(copy));
    CHECK(cxlkv_lease_validate(b, &lease) == CXLKV_OK);
    CHECK(strcmp(copy, "system prompt KV") == 0);
    CHECK(cxlkv_lease_renew(b, &lease) == CXLKV_OK);
    CHECK(cxlkv_lease_release(b, &lease) == CXLKV_OK);
    /* The prefix as a chain: the published block, then one never published (the run ends). */
    {
      uint32_t next_tokens[16];
      for (int i = 0; i < 16; ++i) next_tokens[i] = 2000 + i;
      cxlkv_prefix_key chain[2] = {key, cxlkv_prefix_key_chain(ns, &key, next_tokens, 16)};
      cxlkv_lease leases[2];
      size_t n_leased = 99;
      CHECK(cxlkv_lease_acquire_chain(b, ns, chain, 2, leases, &n_leased) == CXLKV_OK);
      CHECK(n_leased == 1 && leases[0].ref.index == blk.index);
      CHECK(cxlkv_lease_validate(b, &leases[0]) == CXLKV_OK);
      CHECK(cxlkv_lease_acquire_chain(b, ns, chain + 1, 1, leases + 1, &n_leased) == CXLKV_OK);
      CHECK(n_leased == 0);
      CHECK(cxlkv_lease_acquire_chain(b, ns, chain, 2, NULL, &n_leased) == CXLKV_E_INVALID);
      CHECK(cxlkv_lease_release_many(b, leases, 1) == CXLKV_OK);
    }
    cxlkv_arena_stats ps;
    CHECK(cxlkv_arena_stats_get(arena, &ps) == CXLKV_OK);
    CHECK(ps.classes[0].persisted_blocks == 1); /* the domain holds it now */
    /* A chain published in one ring transaction: three blocks, all persisted, all visible
     * after one owner step; then arguments refused with nothing published. */
    {
      cxlkv_publish_item items[3];
      cxlkv_prefix_key parent = key;
      for (int i = 0; i < 3; ++i) {
        uint32_t t[16];
        for (int j = 0; j < 16; ++j) t[j] = 5000 + 16 * i + j;
        void* pb = NULL;
        CHECK(cxlkv_alloc(arena, 0, &items[i].ref, &pb) == CXLKV_OK);
        cxlkv_copy_to_block(pb, "chain block", 12);
        items[i].parent = parent;
        items[i].key = cxlkv_prefix_key_chain(ns, &parent, t, 16);
        parent = items[i].key;
      }
      CHECK(cxlkv_prefix_publish_chain(a, ns, items, 3, NULL, 0) == CXLKV_E_INVALID);
      CHECK(cxlkv_prefix_publish_chain(a, ns, NULL, 3, arena, 0) == CXLKV_E_INVALID);
      CHECK(cxlkv_prefix_publish_chain(a, ns, items, 0, arena, 0) == CXLKV_OK);
      {
        cxlkv_publish_item foreign = items[0];
        foreign.ref.arena_uuid[0] ^= 1;
        CHECK(cxlkv_prefix_publish_chain(a, ns, &foreign, 1, arena, 0) == CXLKV_E_FOREIGN);
      }
      CHECK(cxlkv_prefix_publish_chain(a, ns, items, 3, arena, 100) == CXLKV_OK);
      cxlkv_owner_step(owner);
      cxlkv_prefix_key ckeys[4] = {key, items[0].key, items[1].key, items[2].key};
      cxlkv_lease cl[4];
      size_t n_leased = 0;
      CHECK(cxlkv_lease_acquire_chain(b, ns, ckeys, 4, cl, &n_leased) == CXLKV_OK);
      CHECK(n_leased == 4);
      for (int i = 0; i < 3; ++i) CHECK(cl[i + 1].ref.index == items[i].ref.index);
      CHECK(cxlkv_lease_release_many(b, cl, 4) == CXLKV_OK);
      CHECK(cxlkv_arena_stats_get(arena, &ps) == CXLKV_OK);
      CHECK(ps.classes[0].persisted_blocks == 4);
    }
    /* Reading a leased block: cxlkv_lease_copy_out (invalidate, copy, validate) whole and in
     * part, zero-copy through cxlkv_block_invalidate, bad arguments named, and a retirement
     * between acquire and validate that makes the copy count for nothing. */
    {
      enum { kBlock = 16384 };
      static unsigned char src[kBlock], dst[kBlock];
      for (int i = 0; i < kBlock; ++i) src[i] = (unsigned char)(i * 131 + 7);
      uint32_t t2[16];
      for (int i = 0; i < 16; ++i) t2[i] = 3000 + i;
      cxlkv_prefix_key key2 = cxlkv_prefix_key_chain(ns, NULL, t2, 16);
      cxlkv_block_ref blk2;
      void* p2 = NULL;
      CHECK(cxlkv_alloc(arena, 0, &blk2, &p2) == CXLKV_OK);
      cxlkv_copy_to_block(p2, src, kBlock);
      CHECK(cxlkv_prefix_publish(a, ns, &key2, NULL, arena, &blk2) == CXLKV_OK);
      cxlkv_owner_step(owner);
      cxlkv_prefix_hit h2;
      CHECK(cxlkv_prefix_lookup(b, ns, &key2, &h2) == CXLKV_OK);
      cxlkv_lease l2;
      CHECK(cxlkv_lease_acquire(b, &h2, &l2) == CXLKV_OK);
      CHECK(cxlkv_lease_copy_out(b, arena, &l2, 0, dst, kBlock) == CXLKV_OK);
      CHECK(Checksum(dst, kBlock) == Checksum(src, kBlock));
      memset(dst, 0, kBlock);
      CHECK(cxlkv_lease_copy_out(b, arena, &l2, 1000, dst, 500) == CXLKV_OK);
      CHECK(Checksum(dst, 500) == Checksum(src + 1000, 500));
      const void* in_place = NULL;
      CHECK(cxlkv_block_invalidate(b, arena, &l2, 0, kBlock, &in_place) == CXLKV_OK);
      CHECK(in_place == p2 && Checksum(in_place, kBlock) == Checksum(src, kBlock));
      CHECK(cxlkv_lease_validate(b, &l2) == CXLKV_OK);

      CHECK(cxlkv_lease_copy_out(b, arena, &l2, 0, dst, kBlock + 1) == CXLKV_E_INVALID);
      CHECK(strstr(cxlkv_last_error(), "of 16384 bytes") != NULL);
      CHECK(cxlkv_lease_copy_out(b, arena, &l2, kBlock, dst, 1) == CXLKV_E_INVALID);
      CHECK(cxlkv_lease_copy_out(b, arena, &l2, UINT64_MAX, dst, 2) == CXLKV_E_INVALID);
      CHECK(cxlkv_lease_copy_out(b, arena, &l2, 0, dst, 0) == CXLKV_E_INVALID);
      CHECK(strstr(cxlkv_last_error(), "len") != NULL);
      CHECK(cxlkv_lease_copy_out(b, arena, &l2, 0, NULL, 16) == CXLKV_E_INVALID);
      CHECK(strstr(cxlkv_last_error(), "dst") != NULL);
      CHECK(cxlkv_lease_copy_out(b, arena, NULL, 0, dst, 16) == CXLKV_E_INVALID);
      CHECK(strstr(cxlkv_last_error(), "lease") != NULL);
      CHECK(cxlkv_lease_copy_out(NULL, arena, &l2, 0, dst, 16) == CXLKV_E_INVALID);
      CHECK(cxlkv_block_invalidate(b, arena, &l2, 0, 16, NULL) == CXLKV_E_INVALID);
      CHECK(cxlkv_lease_copy_out(b, NULL, &l2, 0, dst, 16) == CXLKV_E_INVALID);
      CHECK(strstr(cxlkv_last_error(), "orchestrator") != NULL);
      {
        /* A lease whose deadline passed before the copy (the caller was descheduled, or held
         * a lock such as Python's GIL) is taken again and the block copied: the handle comes
         * back live, and the handle it replaced is void. */
        cxlkv_lease late = l2;
        cxlkv_lease_stats st;
        late.deadline_ms = 0;
        CHECK(cxlkv_lease_copy_out(b, arena, &late, 0, dst, 16) == CXLKV_OK);
        CHECK(late.deadline_ms > 0 && late.id != l2.id);
        CHECK(Checksum(dst, 16) == Checksum(src, 16));
        CHECK(cxlkv_domain_lease_stats(b, &st) == CXLKV_OK);
        CHECK(st.leases_retaken == 1 && st.copies_discarded == 0);
        CHECK(cxlkv_lease_validate(b, &l2) == CXLKV_E_STALE);
        CHECK(cxlkv_domain_lease_stats(NULL, &st) == CXLKV_E_INVALID);
        l2 = late;
        /* cxlkv_block_invalidate (in place) still refuses a lease past its deadline. */
        late.deadline_ms = 0;
        CHECK(cxlkv_block_invalidate(b, arena, &late, 0, 16, &in_place) == CXLKV_E_STALE);
        CHECK(strstr(cxlkv_last_error(), "deadline") != NULL);
      }
      /* The publisher retires the entry and the owner applies it while b holds the lease. */
      CHECK(cxlkv_prefix_retire(a, ns, &key2) == CXLKV_OK);
      cxlkv_owner_step(owner);
      CHECK(cxlkv_lease_copy_out(b, arena, &l2, 0, dst, kBlock) == CXLKV_E_STALE);
      CHECK(strstr(cxlkv_last_error(), "retired") != NULL);
      CHECK(cxlkv_lease_validate(b, &l2) == CXLKV_E_STALE);
      CHECK(cxlkv_lease_release(b, &l2) == CXLKV_OK);
      CHECK(cxlkv_prefix_retire(NULL, ns, &key2) == CXLKV_E_INVALID);
    }
    /* Scattered copy-out: three leased blocks read in one cxlkv_lease_copy_out_many call, the
     * last into two destinations; the middle block is retired between acquire and copy, so its
     * item alone fails validation while the good ones around it are copied and validated. */
    {
      enum { kBlock = 16384, kBlocks = 3 };
      static unsigned char src[kBlocks][kBlock], dst[kBlocks][kBlock];
      cxlkv_prefix_key keys[kBlocks];
      cxlkv_prefix_key parent = {0, 0};
      for (int i = 0; i < kBlocks; ++i) {
        for (int j = 0; j < kBlock; ++j) src[i][j] = (unsigned char)(j * 31 + 97 * i + 1);
        uint32_t t[16];
        for (int j = 0; j < 16; ++j) t[j] = (uint32_t)(7000 + 16 * i + j);
        keys[i] = cxlkv_prefix_key_chain(ns, i == 0 ? NULL : &parent, t, 16);
        cxlkv_block_ref r;
        void* pb = NULL;
        CHECK(cxlkv_alloc(arena, 0, &r, &pb) == CXLKV_OK);
        cxlkv_copy_to_block(pb, src[i], kBlock);
        CHECK(cxlkv_prefix_publish(a, ns, &keys[i], i == 0 ? NULL : &parent, arena, &r) ==
              CXLKV_OK);
        parent = keys[i];
      }
      cxlkv_owner_step(owner);
      cxlkv_lease ls[kBlocks];
      size_t n_leased = 0;
      CHECK(cxlkv_lease_acquire_chain(b, ns, keys, kBlocks, ls, &n_leased) == CXLKV_OK);
      CHECK(n_leased == kBlocks);
      cxlkv_copy_out_item items[4] = {
          {arena, &ls[0], 0, dst[0], kBlock},
          {arena, &ls[1], 0, dst[1], kBlock},
          {arena, &ls[2], 0, dst[2], 4096},
          {arena, &ls[2], 4096, dst[2] + 4096, kBlock - 4096},
      };
      int results[4] = {-1, -1, -1, -1};
      CHECK(cxlkv_lease_copy_out_many(b, items, 4, results) == CXLKV_OK);
      for (int i = 0; i < 4; ++i) CHECK(results[i] == CXLKV_OK);
      for (int i = 0; i < kBlocks; ++i) CHECK(Checksum(dst[i], kBlock) == Checksum(src[i], kBlock));
      CHECK(cxlkv_lease_copy_out_many(b, items, 0, NULL) == CXLKV_OK);
      CHECK(cxlkv_lease_copy_out_many(NULL, items, 4, results) == CXLKV_E_INVALID);
      CHECK(cxlkv_lease_copy_out_many(b, items, 4, NULL) == CXLKV_E_INVALID);
      CHECK(cxlkv_lease_copy_out_many(b, NULL, 4, results) == CXLKV_E_INVALID);
      /* The middle block is retired while b holds its lease. */
      CHECK(cxlkv_prefix_retire(a, ns, &keys[1]) == CXLKV_OK);
      cxlkv_owner_step(owner);
      memset(dst, 0, sizeof(dst));
      for (int i = 0; i < 4; ++i) results[i] = -1;
      CHECK(cxlkv_lease_copy_out_many(b, items, 4, results) == CXLKV_E_STALE);
      CHECK(strstr(cxlkv_last_error(), "item 1: ") != NULL);
      CHECK(strstr(cxlkv_last_error(), "retired") != NULL);
      CHECK(results[0] == CXLKV_OK && results[1] == CXLKV_E_STALE);
      CHECK(results[2] == CXLKV_OK && results[3] == CXLKV_OK);
      CHECK(Checksum(dst[0], kBlock) == Checksum(src[0], kBlock));
      CHECK(Checksum(dst[2], kBlock) == Checksum(src[2], kBlock));
      /* An argument error after the stale item is the one returned; the items after it are
       * still copied. */
      items[2].len = kBlock + 1;
      CHECK(cxlkv_lease_copy_out_many(b, items, 4, results) == CXLKV_E_INVALID);
      CHECK(strstr(cxlkv_last_error(), "item 2: ") != NULL);
      CHECK(results[0] == CXLKV_OK && results[1] == CXLKV_E_STALE);
      CHECK(results[2] == CXLKV_E_INVALID && results[3] == CXLKV_OK);
      CHECK(cxlkv_lease_release_many(b, ls, kBlocks) == CXLKV_OK);
    }
    cxlkv_domain_leave(a);
    cxlkv_domain_leave(b);
    cxlkv_owner_close(owner);
    unlink(dspec + 5);
  }

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
