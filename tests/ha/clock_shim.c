/* A clock shim for the HA tests' real processes (LD_PRELOAD; tests/ha/frozen_clock_test.cc):
 * every CLOCK_BOOTTIME reading of a process (and of the children it forks) is its clock less
 * a shift that the test sets, so that a process the test stopped (SIGSTOP) and resumed sees
 * on that clock what a stopped VM's guest sees with kvmclock: no time passed across the stop
 * (audit-ha #1). CLOCK_BOOTTIME is the clock of the leader's write deadline (the election's
 * gate, the fenced Mem) and of its write-back agent; the other clocks keep counting (gRPC and
 * absl wait on the kernel's MONOTONIC and REALTIME, and a shifted reading of those turns
 * their timed waits into busy loops; nothing of the fence reads them).
 *
 * CXLKV_TEST_CLOCK_SHIFT names a file holding one little-endian int64: nanoseconds to take
 * off every CLOCK_BOOTTIME reading. The file is mapped shared on the first reading, so a
 * change by the test applies at once to every process using it. Without the variable, or a
 * file that cannot be mapped, the shim does nothing (the shift reads 0).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec*);

static _Atomic(clock_gettime_fn) real_clock_gettime;
static _Atomic(const _Atomic int64_t*) shift_word; /* NULL: not mapped yet */
static const _Atomic int64_t kNoShift = 0;

static const _Atomic int64_t* Shift(void) {
  const _Atomic int64_t* w = atomic_load(&shift_word);
  if (w != NULL) return w;
  w = &kNoShift;
  const char* path = getenv("CXLKV_TEST_CLOCK_SHIFT");
  if (path != NULL) {
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      void* p = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
      close(fd);
      if (p != MAP_FAILED) w = (const _Atomic int64_t*)p;
    }
  }
  /* Two threads may both map the file: one mapping is kept, the other stays (8 bytes). */
  const _Atomic int64_t* expected = NULL;
  if (!atomic_compare_exchange_strong(&shift_word, &expected, w)) w = expected;
  return w;
}

int clock_gettime(clockid_t id, struct timespec* ts) {
  clock_gettime_fn real = atomic_load(&real_clock_gettime);
  if (real == NULL) {
    real = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
    atomic_store(&real_clock_gettime, real);
  }
  const int rc = real(id, ts);
  if (rc != 0) return rc;
  if (id != CLOCK_BOOTTIME && id != CLOCK_BOOTTIME_ALARM) return rc;
  const int64_t shift = atomic_load(Shift());
  if (shift == 0) return rc;
  int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec - shift;
  ts->tv_sec = (time_t)(ns / 1000000000);
  ts->tv_nsec = (long)(ns % 1000000000);
  if (ts->tv_nsec < 0) {
    ts->tv_nsec += 1000000000;
    ts->tv_sec -= 1;
  }
  return rc;
}
