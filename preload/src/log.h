// Logging for the preload shim: formats on the stack and write(2)s one line, so it can run
// inside malloc. Thread-safe (one write per line).
#ifndef CXLKV_PRELOAD_SRC_LOG_H_
#define CXLKV_PRELOAD_SRC_LOG_H_

#include <string.h>

#include <atomic>
#include <string>

#include "cxlkv/preload/settings.h"

namespace cxlkv::preload {

void LogSetup(LogLevel level, int fd) noexcept;
bool LogEnabled(LogLevel level) noexcept;
void Logf(LogLevel level, const char* fmt, ...) noexcept __attribute__((format(printf, 2, 3)));

// True the first time it is called for `flag` (for "log once" sites).
inline bool FirstTime(std::atomic<bool>& flag) noexcept {
  return !flag.exchange(true, std::memory_order_relaxed);
}

}  // namespace cxlkv::preload

#endif  // CXLKV_PRELOAD_SRC_LOG_H_
