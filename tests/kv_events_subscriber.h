// The KV-event subscriber of tests/kv_events_sub.py (python3-zmq, python3-msgpack) run as a
// child process, and helpers over what it decoded; for kv_events_test and directory_test.
#ifndef CXLKV_TESTS_KV_EVENTS_SUBSCRIBER_H_
#define CXLKV_TESTS_KV_EVENTS_SUBSCRIBER_H_

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "orchestrator_process.h"

namespace cxlkv::testing {

// The Python subscriber as a child process (posix_spawn), its output file read back.
class Subscriber {
 public:
  Subscriber(const std::string& dir, const std::string& topic) : out_(dir + "/events.jsonl") {
    std::vector<std::string> args = {"/usr/bin/python3", CXLKV_SOURCE_DIR "/tests/kv_events_sub.py",
                                     out_, topic, "120"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    EXPECT_EQ(::posix_spawn(&pid_, "/usr/bin/python3", nullptr, nullptr, argv.data(), environ), 0);
  }
  ~Subscriber() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  int Port() {
    int port = 0;
    SoonTrue(
        [&] {
          const auto l = Lines();
          if (!l.empty() && l[0].contains("port")) port = l[0]["port"].get<int>();
          return port != 0;
        },
        std::chrono::milliseconds(10000));
    return port;
  }
  // Every message so far (the first line, the port, left out).
  std::vector<nlohmann::json> Messages() {
    auto l = Lines();
    if (!l.empty()) l.erase(l.begin());
    return l;
  }
  std::vector<nlohmann::json> Lines() {
    std::vector<nlohmann::json> v;
    std::istringstream in(SlurpFile(out_));
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded()) v.push_back(j);
    }
    return v;
  }
  // The events of every message from `from` on, in order.
  std::vector<nlohmann::json> Events(std::size_t from = 0) {
    std::vector<nlohmann::json> e;
    const auto m = Messages();
    for (std::size_t i = from; i < m.size(); ++i) {
      for (const auto& x : m[i]["events"]) e.push_back(x);
    }
    return e;
  }

 private:
  std::string out_;
  pid_t pid_ = -1;
};

inline bool PythonHasZmqAndMsgpack() {
  return std::system("/usr/bin/python3 -c 'import zmq, msgpack' >/dev/null 2>&1") == 0;
}

inline bool HasStored(const std::vector<nlohmann::json>& events, const std::string& hash) {
  for (const auto& e : events) {
    if (e["type"] == "BlockStored" && e["block_hashes"] == nlohmann::json::array({hash})) {
      return true;
    }
  }
  return false;
}

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_KV_EVENTS_SUBSCRIBER_H_
