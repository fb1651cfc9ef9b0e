// Waiting in tests on real processes: a monotonic clock in milliseconds, a poll of a condition
// until a deadline, and whether a server's Unix socket accepts connections yet. Header-only;
// no cxlkv library needed.
#ifndef CXLKV_TESTS_EVENTUALLY_H_
#define CXLKV_TESTS_EVENTUALLY_H_

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

namespace cxlkv::testing {

// Milliseconds on the steady clock: for measuring intervals only.
inline std::int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Polls `cond` every `poll` until it holds or `limit` has passed; then one last try, so a
// condition that became true during the final sleep still counts. The caller's thread runs
// `cond`.
inline bool Eventually(const std::function<bool()>& cond, std::chrono::milliseconds limit,
                       std::chrono::milliseconds poll = std::chrono::milliseconds(10)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(poll);
  }
  return cond();
}

// True when a connection to the Unix socket at `path` is accepted now (the connection is closed
// at once): a server listening there is up.
inline bool AcceptsConnections(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_EVENTUALLY_H_
