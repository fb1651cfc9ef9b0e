// The preload shim with its heap in a pooled CXL domain: an unmodified program
// (tests/preload/pooled_program.cc) runs under LD_PRELOAD with
// CXLKV_POOL=orchestrator:<socket>; a real cxlkv-orchestrator lends the extents.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "orchestrator_process.h"
#include "temp_dir.h"

namespace cxlkv::testing {
namespace {

struct Extent {
  std::uint64_t offset = 0, length = 0;
  unsigned host = 0;
  std::string state;
};

// The operator's view: `cxlkvctl extents --json`.
std::vector<Extent> ListExtents(const OrchestratorProcess& o) {
  const std::string cmd = std::string(CXLKV_CTL_BIN) + " extents --json --socket " + o.socket;
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char buf[4096];
  std::size_t n;
  while (p != nullptr && (n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  if (p != nullptr) pclose(p);
  std::vector<Extent> v;
  const auto j = nlohmann::json::parse(out, nullptr, false);
  if (j.is_discarded() || !j.contains("extents")) return v;
  for (const auto& e : j["extents"]) {
    v.push_back(Extent{std::stoull(e["offset"].get<std::string>()),
                       std::stoull(e["length"].get<std::string>()), e["host_id"].get<unsigned>(),
                       e["state"].get<std::string>()});
  }
  return v;
}

std::vector<Extent> HeldBy(const OrchestratorProcess& o, unsigned host) {
  std::vector<Extent> held;
  for (const Extent& e : ListExtents(o)) {
    if (e.state == "assigned" && e.host == host) held.push_back(e);
  }
  return held;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The program under the shim, driven over pipes.
class Program {
 public:
  Program(const std::vector<std::string>& env) {
    int in[2], out[2];
    EXPECT_EQ(pipe(in), 0);
    EXPECT_EQ(pipe(out), 0);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(in[0], 0);
      dup2(out[1], 1);
      close(in[1]);
      close(out[0]);
      for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
      execl(CXLKV_POOLED_PROGRAM, CXLKV_POOLED_PROGRAM, nullptr);
      _exit(127);
    }
    close(in[0]);
    close(out[1]);
    to_ = fdopen(in[1], "w");
    from_ = fdopen(out[0], "r");
  }
  ~Program() {
    if (to_ != nullptr) std::fclose(to_);
    if (from_ != nullptr) std::fclose(from_);
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  std::string Ask(const std::string& cmd) {
    std::fprintf(to_, "%s\n", cmd.c_str());
    std::fflush(to_);
    char line[512];
    if (std::fgets(line, sizeof(line), from_) == nullptr) return "(no reply)";
    std::string s(line);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  int Exit() {
    std::fprintf(to_, "exit\n");
    std::fflush(to_);
    int st = 0;
    waitpid(pid_, &st, 0);
    pid_ = -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  FILE* to_ = nullptr;
  FILE* from_ = nullptr;
};

// The program's heap grows extent by extent; its bytes are in the granted extents of the
// pool; when the orchestrator is unreachable past the capacity lease the extents are revoked:
// the program's objects keep their contents, and what it writes afterwards no longer
// reaches the pool (which may be lent to another host by then). After it exits, the
// extents go back to the free pool.
TEST(PreloadPooled, HeapLivesInLentExtentsAndKeepsItsObjectsWhenRevoked) {
  OrchestratorProcess o("lease_ttl_ms = 400\nhost_ttl_ms = 400\nheartbeat_period_ms = 50\n"
                        "grace_ms = 20\ncapacity_lease_ms = 1000\n");
  o.Start();
  const std::string log = o.dir + "/shim.log", stats = o.dir + "/stats.json";
  Program prog({"LD_PRELOAD=" CXLKV_PRELOAD_SO, "CXLKV_POOL=orchestrator:" + o.socket,
                "CXLKV_HOST_ID=1", "CXLKV_LIBRARY=" CXLKV_LIBRARY_SO, "CXLKV_MIN_BYTES=1M",
                "CXLKV_LOG=info," + log, "CXLKV_STATS=" + stats});
  // 6 x 4 MiB: more than one 16 MiB extent holds.
  ASSERT_EQ(prog.Ask("alloc 6"), "ok") << ReadAll(log);
  const std::vector<Extent> held = HeldBy(o, 1);
  ASSERT_GE(held.size(), 2u) << "the heap grew by extents\n" << ReadAll(log);

  const std::string mark_a = "cxlkv-pooled-mark-A-" + std::to_string(prog.pid());
  ASSERT_EQ(prog.Ask("mark " + mark_a), "ok");
  std::string pool = ReadAll(o.pool);
  const auto at = pool.find(mark_a);
  ASSERT_NE(at, std::string::npos) << "the program's heap bytes are in the pool file";
  bool in_held = false;
  for (const Extent& e : held) in_held = in_held || (at >= e.offset && at < e.offset + e.length);
  EXPECT_TRUE(in_held) << "at offset " << at << ", outside the extents lent to host 1";
  ASSERT_EQ(prog.Ask("check"), "ok");

  // The orchestrator stops answering: no heartbeat renews the capacity lease.
  kill(o.pid, SIGSTOP);
  const bool revoked = WaitFor([&] {
    const std::string l = ReadAll(log);
    std::size_t n = 0;
    for (auto p = l.find("revoked:"); p != std::string::npos; p = l.find("revoked:", p + 1)) ++n;
    return n >= held.size();
  }, std::chrono::milliseconds(10000));
  EXPECT_TRUE(revoked) << ReadAll(log);
  EXPECT_EQ(prog.Ask("check"), "ok") << "the objects kept their contents through the revocation";
  const std::string mark_b = "cxlkv-pooled-mark-B-" + std::to_string(prog.pid());
  ASSERT_EQ(prog.Ask("mark " + mark_b), "ok");
  pool = ReadAll(o.pool);
  EXPECT_EQ(pool.find(mark_b), std::string::npos)
      << "a write after the revocation reached the pool";
  EXPECT_NE(pool.find(mark_a), std::string::npos);
  kill(o.pid, SIGCONT);

  // The client rejoins; the heap keeps serving (new extents, or the process allocator).
  EXPECT_EQ(prog.Ask("alloc 2"), "ok");
  EXPECT_EQ(prog.Ask("check"), "ok");
  // A forked child keeps a private copy and allocates outside the parent's extents.
  EXPECT_EQ(prog.Ask("fork"), "ok");
  EXPECT_EQ(prog.Ask("check"), "ok");
  EXPECT_EQ(prog.Exit(), 0);

  EXPECT_TRUE(WaitFor([&] {
    for (const Extent& e : ListExtents(o)) {
      if (e.state != "free") return false;
    }
    return true;
  }, std::chrono::milliseconds(15000)))
      << "every extent is free again after the program left";
  const auto j = nlohmann::json::parse(ReadAll(stats), nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << ReadAll(stats);
  EXPECT_EQ(j["state"], "cxl") << j.dump();
  EXPECT_GE(j["classes"]["malloc"]["cxl"]["allocs"].get<std::uint64_t>(), 6u) << j.dump();
  EXPECT_NE(j["detail"].get<std::string>().find("revoked"), std::string::npos) << j.dump();
}

// A process that never asks for CXL-sized memory never joins the domain.
TEST(PreloadPooled, ProcessesWithoutLargeAllocationsDoNotJoin) {
  OrchestratorProcess o("lease_ttl_ms = 400\nhost_ttl_ms = 400\nheartbeat_period_ms = 50\n"
                        "grace_ms = 20\ncapacity_lease_ms = 1000\n");
  o.Start();
  Program prog({"LD_PRELOAD=" CXLKV_PRELOAD_SO, "CXLKV_POOL=orchestrator:" + o.socket,
                "CXLKV_HOST_ID=2", "CXLKV_LIBRARY=" CXLKV_LIBRARY_SO, "CXLKV_MIN_BYTES=64M"});
  ASSERT_EQ(prog.Ask("alloc 1"), "ok");  // 4 MiB < 64 MiB: passes through
  EXPECT_TRUE(HeldBy(o, 2).empty());
  const std::string cmd = std::string(CXLKV_CTL_BIN) + " hosts --socket " + o.socket;
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  char line[512];
  while (p != nullptr && std::fgets(line, sizeof(line), p) != nullptr) out += line;
  if (p != nullptr) pclose(p);
  EXPECT_EQ(out.find("\n2 "), std::string::npos) << out;
  EXPECT_EQ(prog.Exit(), 0);
}

// A wrong library or a missing host id is an error naming the fix; the program still runs.
TEST(PreloadPooled, BadSettingsNameTheFixAndPassThrough) {
  const cxlkv::testing::TempDir scratch("pooled", "/tmp");  // removed however the test ends
  ASSERT_FALSE(scratch.path().empty());
  const std::string tmpl = scratch.path();
  const std::string dir = tmpl;
  struct Case {
    std::vector<std::string> env;
    std::string expect;
  };
  const Case cases[] = {
      {{"CXLKV_POOL=orchestrator:/nonexistent.sock"}, "needs CXLKV_HOST_ID"},
      {{"CXLKV_POOL=orchestrator:/nonexistent.sock", "CXLKV_HOST_ID=1",
        "CXLKV_LIBRARY=/nonexistent/libcxlkv.so.0"},
       "point CXLKV_LIBRARY at libcxlkv.so.0"},
      {{"CXLKV_POOL=orchestrator:", "CXLKV_HOST_ID=1"}, "name the orchestrator's socket"},
      {{"CXLKV_POOL=orchestrator:/x.sock", "CXLKV_HOST_ID=one"}, "host_id 'one'"},
  };
  for (const Case& c : cases) {
    const std::string err = dir + "/err";
    std::vector<std::string> env = c.env;
    env.push_back("LD_PRELOAD=" CXLKV_PRELOAD_SO);
    const pid_t pid = fork();
    if (pid == 0) {
      const int fd = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 2);
      const int in = open("/dev/null", O_RDONLY);
      dup2(in, 0);
      for (const std::string& e : env) putenv(const_cast<char*>(e.c_str()));
      execl(CXLKV_POOLED_PROGRAM, CXLKV_POOLED_PROGRAM, nullptr);
      _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << st;
    EXPECT_NE(ReadAll(err).find(c.expect), std::string::npos)
        << "expected '" << c.expect << "' in:\n" << ReadAll(err);
  }
}

}  // namespace
}  // namespace cxlkv::testing
