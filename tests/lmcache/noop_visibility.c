/* A visibility library that does nothing and reports success: what LMCache's documents call
 * not acceptable. Test-only (docs/lmcache.md "Qualification"): the qualification kit run over
 * the simulated fabric must fail with it. */
#include <stddef.h>
#include <stdint.h>

__attribute__((visibility("default"))) int lmcache_shared_l1_visibility_v1(
    const char* mode, uint32_t operation, int device_fd, void* mapped_address,
    uint64_t device_offset, size_t length, uint64_t generation) {
  (void)mode;
  (void)operation;
  (void)device_fd;
  (void)mapped_address;
  (void)device_offset;
  (void)length;
  (void)generation;
  return 0;
}
