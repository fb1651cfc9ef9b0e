/* The C API's GPU calls. Built without CUDA: every call is CXLKV_E_NO_CUDA with a message
 * saying so. Built with CUDA on a machine without a GPU: cxlkv_gpu_open is
 * CXLKV_E_NO_DEVICE. With a GPU: register an arena, copy blocks to the device and back
 * (DMA one way, the kernel the other) and compare checksums. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cxlkv/cxlkv.h"

#if CXLKV_TEST_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define CHECK(cond)                                                                           \
  do {                                                                                        \
    if (!(cond)) {                                                                            \
      fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, #cond, \
              cxlkv_last_error());                                                            \
      exit(1);                                                                                \
    }                                                                                         \
  } while (0)

static uint64_t Fnv(const void* p, size_t n) {
  const uint8_t* b = (const uint8_t*)p;
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

int main(void) {
  cxlkv_gpu* gpu = (cxlkv_gpu*)&gpu; /* must be cleared or left alone, never used */
  int rc = cxlkv_gpu_open(0, &gpu);
#if !CXLKV_TEST_HAVE_CUDA
  CHECK(rc == CXLKV_E_NO_CUDA);
  CHECK(strstr(cxlkv_last_error(), "built without CUDA") != NULL);
  CHECK(strcmp(cxlkv_strerror(rc), "built without CUDA") == 0);
  uint64_t ticket = 0;
  CHECK(cxlkv_gpu_copy_blocks(NULL, NULL, 0, NULL, 0, 0, 0, 0, &ticket) == CXLKV_E_NO_CUDA);
  CHECK(cxlkv_gpu_register(NULL, NULL, &ticket) == CXLKV_E_NO_CUDA);
  CHECK(cxlkv_gpu_poll(NULL, 1) == CXLKV_E_NO_CUDA);
  printf("capi_gpu_test: built without CUDA, as reported: %s\n", cxlkv_last_error());
  return 0;
#else
  if (rc == CXLKV_E_NO_DEVICE) {
    CHECK(strstr(cxlkv_last_error(), "no CUDA device") != NULL);
    CHECK(strcmp(cxlkv_strerror(rc), "no CUDA device") == 0);
    printf("capi_gpu_test: no GPU here, as reported: %s\n", cxlkv_last_error());
    CHECK(cxlkv_gpu_open(-1, &gpu) == CXLKV_E_NO_DEVICE);
    CHECK(cxlkv_gpu_poll(NULL, 1) == CXLKV_E_INVALID);
    return 0;
  }
  CHECK(rc == CXLKV_OK);
  cxlkv_gpu* none = NULL;
  CHECK(cxlkv_gpu_open(4096, &none) == CXLKV_E_NO_DEVICE && none == NULL);

  /* An arena of 8 KiB blocks: 2 layers x K,V x 2 KiB. */
  cxlkv_pool* pool;
  cxlkv_arena* arena;
  CHECK(cxlkv_pool_open("memfd:capi-gpu?size=16M", &pool) == CXLKV_OK);
  cxlkv_arena_options o;
  memset(&o, 0, sizeof(o));
  o.layout = (cxlkv_kv_layout){2, 1, 64, 2, 16, 0};
  CHECK(cxlkv_arena_create(pool, &o, &arena) == CXLKV_OK);
  const uint64_t block = cxlkv_block_size(arena, 0);
  CHECK(block == 8192);
  enum { N = 16 };
  cxlkv_block_ref refs[N];
  void* addrs[N];
  CHECK(cxlkv_alloc_bulk(arena, 0, N, refs, addrs) == CXLKV_OK);
  uint64_t sums[N];
  for (int i = 0; i < N; ++i) {
    for (uint64_t j = 0; j < block; ++j) ((uint8_t*)addrs[i])[j] = (uint8_t)(i * 131 + j * 7);
    sums[i] = Fnv(addrs[i], block);
  }

  uint64_t reg;
  CHECK(cxlkv_gpu_register(gpu, arena, &reg) == CXLKV_OK);
  CHECK(cxlkv_gpu_register(gpu, arena, &reg) == CXLKV_E_EXISTS);
  CHECK(cxlkv_gpu_register_wait(gpu, reg) == CXLKV_OK);
  cxlkv_gpu_registration_stats st;
  CHECK(cxlkv_gpu_register_poll(gpu, reg, &st) == CXLKV_OK);
  CHECK(st.state == CXLKV_GPU_REGISTERED && st.bytes_done == st.bytes && st.chunks_done == 1);
  void* dptr = NULL;
  CHECK(cxlkv_gpu_device_pointer(gpu, addrs[0], &dptr) == CXLKV_OK && dptr != NULL);

  void* dev = NULL;
  CHECK(cudaMalloc(&dev, 2 * N * block) == cudaSuccess);
  uint64_t bases[2];
  const uint64_t chunk = 2048;
  cxlkv_gpu_cache cache = {2, 2, 2 * N, 0, chunk, 2 * 2 * chunk, chunk, bases};
  bases[0] = (uint64_t)(uintptr_t)dev;
  bases[1] = bases[0] + 2 * chunk;
  cxlkv_gpu_block in[N];
  for (int i = 0; i < N; ++i) in[i] = (cxlkv_gpu_block){addrs[i], (uint32_t)(2 * N - 1 - 2 * i), 0};
  uint64_t t;
  CHECK(cxlkv_gpu_copy_blocks(gpu, &cache, CXLKV_GPU_TO_DEVICE, in, N, 0, 0, 0, &t) == CXLKV_OK);
  CHECK(cxlkv_gpu_wait(gpu, t) == CXLKV_OK);
  CHECK(cxlkv_gpu_poll(gpu, t) == CXLKV_OK);
  for (int i = 0; i < N; ++i) memset(addrs[i], 0, block);
  CHECK(cxlkv_gpu_copy_blocks(gpu, &cache, CXLKV_GPU_TO_HOST, in, N, 0, 0, CXLKV_GPU_KERNEL, &t) ==
        CXLKV_OK);
  CHECK(cxlkv_gpu_wait(gpu, t) == CXLKV_OK);
  for (int i = 0; i < N; ++i) CHECK(Fnv(addrs[i], block) == sums[i]);

  /* Bad lists are refused whole, naming the entry. */
  in[1].page = in[0].page;
  CHECK(cxlkv_gpu_copy_blocks(gpu, &cache, CXLKV_GPU_TO_DEVICE, in, N, 0, 0, 0, &t) ==
        CXLKV_E_INVALID);
  CHECK(strstr(cxlkv_last_error(), "entries 0 and 1") != NULL);
  CHECK(cxlkv_gpu_poll(gpu, 999999) == CXLKV_E_NOT_FOUND);

  CHECK(cxlkv_gpu_unregister(gpu, reg) == CXLKV_OK);
  in[1].page = (uint32_t)(2 * N - 3); /* its own page again: the list is valid */
  CHECK(cxlkv_gpu_copy_blocks(gpu, &cache, CXLKV_GPU_TO_DEVICE, in, N, 0, 0, 0, &t) ==
        CXLKV_E_NOT_FOUND);
  cudaFree(dev);
  cxlkv_gpu_close(gpu);
  CHECK(cxlkv_free_bulk(arena, refs, N) == CXLKV_OK);
  cxlkv_arena_close(arena);
  cxlkv_pool_close(pool);
  printf("capi_gpu_test: registered, copied both ways, checksums match\n");
  return 0;
#endif
}
