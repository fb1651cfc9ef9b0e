#include "log.h"

#include <unistd.h>

#include <cstdarg>
#include <cstdio>

namespace cxlkv::preload {
namespace {
std::atomic<int> log_level{static_cast<int>(LogLevel::kWarn)};
std::atomic<int> log_fd{2};
}  // namespace

void LogSetup(LogLevel level, int fd) noexcept {
  log_level.store(static_cast<int>(level), std::memory_order_relaxed);
  log_fd.store(fd, std::memory_order_relaxed);
}

bool LogEnabled(LogLevel level) noexcept {
  return level != LogLevel::kOff &&
         static_cast<int>(level) <= log_level.load(std::memory_order_relaxed);
}

void Logf(LogLevel level, const char* fmt, ...) noexcept {
  if (!LogEnabled(level)) return;
  char buf[2048];
  int n = std::snprintf(buf, sizeof(buf), "cxlkv-preload[%d] %s: ", static_cast<int>(::getpid()),
                        LogLevelName(level));
  va_list ap;
  va_start(ap, fmt);
  const int m = std::vsnprintf(buf + n, sizeof(buf) - static_cast<std::size_t>(n) - 1, fmt, ap);
  va_end(ap);
  n += m < 0 ? 0 : m;
  if (n > static_cast<int>(sizeof(buf)) - 2) n = static_cast<int>(sizeof(buf)) - 2;
  buf[n++] = '\n';
  const int fd = log_fd.load(std::memory_order_relaxed);
  for (int off = 0; off < n;) {
    const ssize_t w = ::write(fd, buf + off, static_cast<std::size_t>(n - off));
    if (w <= 0) break;
    off += static_cast<int>(w);
  }
}

}  // namespace cxlkv::preload
