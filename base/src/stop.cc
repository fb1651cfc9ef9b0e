// ListenerWake (stop.h): a connection every few milliseconds to a stopping server's port, and
// the reading side of the connections it accepted shut.
#include "cxlkv/base/stop.h"

#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <utility>

namespace cxlkv::base {

namespace {

// The address to connect to for a server told to listen on `host`: wildcards become the
// loopback of their family, brackets go.
std::string Target(std::string host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  if (host.empty() || host == "0.0.0.0" || host == "*") return "127.0.0.1";
  if (host == "::") return "::1";
  return host;
}

// One non-blocking connect, completed or not within `wait_ms`, then closed.
bool ConnectOnce(const addrinfo& a, int wait_ms) {
  const int fd = ::socket(a.ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  bool made = ::connect(fd, a.ai_addr, a.ai_addrlen) == 0;
  if (!made && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    made = ::poll(&p, 1, wait_ms) == 1;
  }
  ::close(fd);
  return made;
}

// The local port of `fd` when it is a connected (not listening) TCP socket; 0 otherwise.
int ConnectionPort(int fd) {
  int accepting = 1;
  socklen_t len = sizeof(accepting);
  // ENOTSOCK for every descriptor that is not a socket.
  if (::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) != 0 || accepting != 0) {
    return 0;
  }
  int type = 0;
  len = sizeof(type);
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_STREAM) return 0;
  sockaddr_storage a{};
  len = sizeof(a);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return 0;
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return 0;
}

// shutdown(SHUT_RD) of every connection of this process whose local port is `port`.
void ShutReadsOnPort(int port) {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return;
  const int own = ::dirfd(d);
  while (const dirent* e = ::readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || fd == own) continue;
    if (ConnectionPort(static_cast<int>(fd)) == port) ::shutdown(static_cast<int>(fd), SHUT_RD);
  }
  ::closedir(d);
}

}  // namespace

ListenerWake::ListenerWake(std::string host, int port, std::chrono::milliseconds every) {
  if (port <= 0) return;
  thread_ = std::thread([this, target = Target(std::move(host)), port, every] {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (::getaddrinfo(target.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) {
      found = nullptr;
    }
    const int wait_ms = static_cast<int>(every.count());
    do {
      if (found != nullptr && ConnectOnce(*found, wait_ms)) connects_.fetch_add(1);
      ShutReadsOnPort(port);
    } while (!done_.SleepFor(every));
    if (found != nullptr) ::freeaddrinfo(found);
  });
}

ListenerWake::~ListenerWake() {
  done_.Stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace cxlkv::base
