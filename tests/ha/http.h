// HTTP/1.0 on loopback for the HA tests: an orchestrator's Prometheus endpoint and its
// LMCache coordinator.
#ifndef CXLKV_TESTS_HA_HTTP_H_
#define CXLKV_TESTS_HA_HTTP_H_

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace cxlkv::testing {

// GET http://127.0.0.1:port/metrics ("" when nothing answers).
inline std::string Metrics(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n = 0;
      while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  return out;
}

// One HTTP/1.0 request to 127.0.0.1:port with a bearer token ("" : none): the status (0: no
// answer) and the body.
inline std::pair<int, std::string> Http(int port, const std::string& method,
                                        const std::string& path, const std::string& token,
                                        const std::string& body = "") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string out;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    std::string req = absl::StrCat(method, " ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n");
    if (!token.empty()) absl::StrAppend(&req, "Authorization: Bearer ", token, "\r\n");
    absl::StrAppend(&req, "Content-Type: application/json\r\nContent-Length: ", body.size(),
                    "\r\n\r\n", body);
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[4096];
      ssize_t n = 0;
      while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<std::size_t>(n));
    }
  }
  ::close(fd);
  const std::size_t sp = out.find(' '), end = out.find("\r\n\r\n");
  if (sp == std::string::npos || end == std::string::npos) return {0, ""};
  return {std::atoi(out.c_str() + sp + 1), out.substr(end + 4)};
}

// The value of a metric line that starts with `name` followed by a space (-1: absent).
inline double MetricValue(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(name + " ", 0) == 0) return std::atof(line.c_str() + name.size() + 1);
  }
  return -1;
}

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_HA_HTTP_H_
