/* cxlkv/lmcache/visibility.h — LMCache's shared-L1 visibility ABI, implemented over cxlkv's
 * cache-line discipline (coherence/cache.h). Built as liblmcache_shared_l1_visibility.so.
 *
 * LMCache's multi-process server with a shared device-DAX L1 (one CXL pool mapped by several
 * hosts) does not trust MAP_SHARED or msync() to make a write on one host visible to a read
 * on another: it loads an operator-supplied library by absolute path
 * (--l1-shared-visibility-library-path) with ctypes and calls one function of it after each
 * write (publish) and before each read (acquire) of an object's exact byte range. This is
 * that library for pools whose hosts share memory without hardware coherence (CXL 2.0
 * switch-pooled DRAM): publish writes the range's cache lines back to memory and fences;
 * acquire drops the range's lines from this host's cache, so the next loads fetch memory.
 *
 * The ABI is one C function; its version is in its name (a later revision is a new symbol,
 * so a caller asking for _v2 finds none and refuses to start). It has no handle, no state
 * and no table of functions. Target: LMCache's shared_l1 visibility loader as of 2026-09
 * (lmcache/v1/distributed/shared_l1/visibility.py, docs/design/v1/shared_dax_l1.md).
 *
 * Contract of lmcache_shared_l1_visibility_v1 (docs/lmcache.md):
 *   mode            "software_fenced", the only mode this library implements.
 *   operation       1 (publish: the range was written by this host and is complete) or
 *                   2 (acquire: the range is about to be read by this host).
 *   device_fd       the open descriptor of the device (or file) the range is mapped from;
 *                   checked to be open, not otherwise used: the cache instructions work on
 *                   the mapping.
 *   mapped_address  the range's first byte in this process: a 64-byte boundary.
 *   device_offset   the range's offset on the device, mapping offset included: a 64-byte
 *                   boundary (equal to mapped_address modulo 64, as any mapping keeps).
 *   length          the range's exact byte count, > 0. A partial last line is covered whole:
 *                   write-back and eviction never change memory contents, so the bytes past
 *                   `length` in that line (inside the caller's 64-byte-aligned allocation) keep
 *                   their values.
 *   generation      the object's generation in LMCache's coordinator; not used (the call
 *                   keeps nothing per object).
 * Returns 0, or a negative errno and does nothing:
 *   -EINVAL      mode is NULL, operation is not 1 or 2, mapped_address or device_offset is
 *                not 64-byte aligned, length is 0, or the range wraps the address or
 *                offset space;
 *   -EOPNOTSUPP  mode is not "software_fenced";
 *   -EBADF       device_fd is negative or not an open descriptor;
 *   -EFAULT      mapped_address is NULL.
 * The range must be mapped readable in this process (a cache-line write-back of an address
 * that is not mapped faults, like a load). Synchronous: on return from publish every line of
 * the range is in memory, ordered before any later store of this thread (the coordinator's
 * commit); on return from acquire no line of the range is in this host's cache and later
 * loads wait for that. Thread-safe; no allocation; cost ~ one cache-line instruction per
 * 64 bytes plus one fence (and one fcntl for the descriptor check).
 */
#ifndef CXLKV_LMCACHE_VISIBILITY_H_
#define CXLKV_LMCACHE_VISIBILITY_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LMCACHE_SHARED_L1_VISIBILITY_MODE "software_fenced"
#define LMCACHE_SHARED_L1_VISIBILITY_PUBLISH 1u
#define LMCACHE_SHARED_L1_VISIBILITY_ACQUIRE 2u
#define LMCACHE_SHARED_L1_VISIBILITY_GRANULARITY 64u

int lmcache_shared_l1_visibility_v1(const char* mode, uint32_t operation, int device_fd,
                                    void* mapped_address, uint64_t device_offset, size_t length,
                                    uint64_t generation);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif /* CXLKV_LMCACHE_VISIBILITY_H_ */
