/* A program built against an installed cxlkv only (tests/install/run.sh builds it twice: with
 * pkg-config and with find_package(cxlkv)). It opens a memfd pool, formats an arena, allocates
 * a block, writes and reads it back, frees it, and checks that the libcxlkv it runs on is the
 * installed one: argv[1] is the directory it must come from. Exit 0 when all of that holds. */
#define _GNU_SOURCE
#include <cxlkv/cxlkv.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int Fail(const char* what, int rc) {
  fprintf(stderr, "consumer: %s failed: %d (%s) — %s\n", what, rc, cxlkv_strerror(rc),
          cxlkv_last_error());
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s <directory the installed libcxlkv.so.0 is in>\n", argv[0]);
    return 2;
  }
  Dl_info info;
  char got[PATH_MAX], want[PATH_MAX];
  if (dladdr((void*)&cxlkv_alloc, &info) == 0 || info.dli_fname == NULL ||
      realpath(info.dli_fname, got) == NULL || realpath(argv[1], want) == NULL) {
    fprintf(stderr, "consumer: cannot tell where libcxlkv was loaded from\n");
    return 1;
  }
  const size_t n = strlen(want);
  if (strncmp(got, want, n) != 0 || got[n] != '/') {
    fprintf(stderr, "consumer: libcxlkv loaded from %s, not from the install in %s\n", got, want);
    return 1;
  }

  cxlkv_pool* pool = NULL;
  int rc = cxlkv_pool_open("memfd:cxlkv-install-test?size=16M", &pool);
  if (rc != CXLKV_OK) return Fail("cxlkv_pool_open", rc);
  cxlkv_arena_options opt;
  memset(&opt, 0, sizeof(opt));
  opt.layout.layers = 2;
  opt.layout.kv_heads = 2;
  opt.layout.head_dim = 64;
  opt.layout.dtype_bytes = 2;
  opt.layout.tokens_per_block = 16; /* 2 * 2 * 2 * 64 * 2 * 16 = 16 KiB blocks */
  cxlkv_arena* arena = NULL;
  rc = cxlkv_arena_create(pool, &opt, &arena);
  if (rc != CXLKV_OK) return Fail("cxlkv_arena_create", rc);
  const uint64_t bytes = cxlkv_block_size(arena, 0);
  if (bytes != 16384) {
    fprintf(stderr, "consumer: block size %llu, expected 16384\n", (unsigned long long)bytes);
    return 1;
  }
  cxlkv_block_ref ref;
  void* addr = NULL;
  rc = cxlkv_alloc(arena, 0, &ref, &addr);
  if (rc != CXLKV_OK) return Fail("cxlkv_alloc", rc);
  static const char kMsg[] = "a KV block through the installed C API";
  cxlkv_copy_to_block(addr, kMsg, sizeof(kMsg));
  void* back = NULL;
  rc = cxlkv_ref_to_addr(arena, &ref, &back);
  if (rc != CXLKV_OK) return Fail("cxlkv_ref_to_addr", rc);
  if (back != addr || memcmp(back, kMsg, sizeof(kMsg)) != 0) {
    fprintf(stderr, "consumer: the block does not read back what was written\n");
    return 1;
  }
  rc = cxlkv_free(arena, &ref);
  if (rc != CXLKV_OK) return Fail("cxlkv_free", rc);
  rc = cxlkv_free(arena, &ref);
  if (rc != CXLKV_E_DOUBLE_FREE) return Fail("a second cxlkv_free (expected DOUBLE_FREE)", rc);
  cxlkv_arena_close(arena);
  cxlkv_pool_close(pool);
  printf("consumer: %llu-byte block allocated, written, read back and freed with %s\n",
         (unsigned long long)bytes, got);
  return 0;
}
