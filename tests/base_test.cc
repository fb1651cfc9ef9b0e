// base/: byte counts (ParseSize, FormatBytes), errno as text and Status, the TOML reader, the
// annotated mutex, stopping waits (StopSignal, ListenerWake).
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "cxlkv/base/bytes.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/base/mutex.h"
#include "cxlkv/base/stop.h"
#include "cxlkv/base/toml_reader.h"
#include "eventually.h"
#include "gtest/gtest.h"

namespace cxlkv::base {
namespace {

TEST(Bytes, Sizes) {
  EXPECT_EQ(*ParseSize("4096"), 4096u);
  EXPECT_EQ(*ParseSize("64K"), 65536u);
  EXPECT_EQ(*ParseSize("2MiB"), 2u << 20);
  EXPECT_EQ(*ParseSize("3g"), 3ull << 30);
  EXPECT_FALSE(ParseSize("").ok());
  EXPECT_FALSE(ParseSize("G").ok());
  EXPECT_FALSE(ParseSize("1X").ok());
  EXPECT_FALSE(ParseSize("20000000T").ok());
  EXPECT_EQ(FormatBytes(5u << 20), "5 MiB");
}

TEST(Errno, StatusNamesTheObjectCallAndHint) {
  const absl::Status st = ErrnoStatus(ENOENT, "/dev/dax9.9", "open");
  EXPECT_TRUE(absl::IsNotFound(st)) << st;
  EXPECT_NE(st.message().find("/dev/dax9.9: open: No such file or directory"), std::string::npos)
      << st;
  EXPECT_NE(st.message().find("daxctl list"), std::string::npos) << st;
  EXPECT_TRUE(absl::IsPermissionDenied(ErrnoStatus(EACCES, "x", "open")));
  EXPECT_TRUE(absl::IsResourceExhausted(ErrnoStatus(ENOSPC, "x", "write")));
  EXPECT_TRUE(absl::IsInvalidArgument(ErrnoStatus(EINVAL, "x", "mmap")));
  EXPECT_TRUE(absl::IsUnavailable(ErrnoStatus(EBUSY, "x", "flock")));
  EXPECT_TRUE(absl::IsInternal(ErrnoStatus(EIO, "x", "read")));
  EXPECT_EQ(ErrnoText(ENOENT), "No such file or directory");
}

TEST(TomlReader, ErrorsNameTheSourceLineAndKey) {
  auto doc = ParseToml("[a]\nsize = \"12Q\"\nn = 7\n", "domain.toml");
  ASSERT_TRUE(doc.ok()) << doc.status();
  const TomlReader r("domain.toml");
  std::uint64_t size = 0;
  const absl::Status st = r.Size(*doc->get("a")->as_table()->get("size"), "a.size", &size);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("domain.toml:2: key 'a.size':"), std::string::npos) << st;
  std::uint32_t n = 0;
  EXPECT_TRUE(
      absl::IsInvalidArgument(r.U32(*doc->get("a")->as_table()->get("n"), "a.n", &n, 0, 5)));
  EXPECT_TRUE(r.U32(*doc->get("a")->as_table()->get("n"), "a.n", &n, 0, 10).ok());
  EXPECT_EQ(n, 7u);
  auto bad = ParseToml("[a\n", "broken.toml");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_NE(bad.status().message().find("broken.toml:1:"), std::string::npos) << bad.status();
}

// The annotated mutex is std::mutex underneath: a waiter on the CondVar releases it (the other
// thread takes it and sets the flag), wakes on the notify and holds it again; after the scope
// it is free.
TEST(Mutex, CondVarReleasesWaitsAndRetakes) {
  Mutex mu;
  CondVar cv;
  bool ready = false;
  int seen = 0;
  std::thread t([&] {
    MutexLock l(mu);
    ready = true;
    cv.NotifyAll();
  });
  {
    MutexLock l(mu);
    while (!ready) cv.Wait(mu);
    seen = 1;
  }
  t.join();
  EXPECT_EQ(seen, 1);
  if (mu.TryLock()) {
    mu.Unlock();
  } else {
    ADD_FAILURE() << "the mutex is still held after its MutexLock's scope";
  }
}

// A wait of an hour ends when another thread stops the signal (were it a sleep, the test would
// hang until ctest's timeout); Stop reports only the call that raised the flag.
TEST(StopSignal, StopEndsAWaitAndIsRaisedOnce) {
  StopSignal s;
  EXPECT_FALSE(s.stopped());
  EXPECT_FALSE(s.SleepFor(std::chrono::milliseconds(0)));
  std::atomic<bool> waiting{false};
  bool woke_stopped = false;
  std::thread t([&] {
    waiting.store(true);
    woke_stopped = s.SleepFor(std::chrono::hours(1));
  });
  ASSERT_TRUE(cxlkv::testing::Eventually([&] { return waiting.load(); }, std::chrono::seconds(30)));
  EXPECT_TRUE(s.Stop());
  t.join();
  EXPECT_TRUE(woke_stopped);
  EXPECT_FALSE(s.Stop());
  EXPECT_TRUE(s.stopped());
  EXPECT_TRUE(s.flag().load());
  EXPECT_TRUE(s.SleepFor(std::chrono::hours(1)));  // stopped already: returns at once
}

// ListenerWake told the wildcard address reaches a listener on the loopback: its listening
// socket becomes readable (what ends civetweb's poll), and keeps becoming so while it lives.
// A thread of the server waiting for the next request on a kept-alive connection wakes and
// reads the end (its read side shut); the client's socket (another local port) is left alone.
TEST(ListenerWake, WakesTheListenerAndIdleConnections) {
  const int l = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(l, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(l, 16), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  // A kept-alive connection, idle: the server's end waits for a request that never comes.
  const int client = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(::connect(client, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const int server_end = ::accept(l, nullptr, nullptr);
  ASSERT_GE(server_end, 0);
  long got = -1;
  std::thread waiter([&] {
    pollfd p{server_end, POLLIN, 0};
    // 60 s: a limit for a broken build, not a verdict (the wake comes within milliseconds).
    if (::poll(&p, 1, 60'000) == 1) {
      char c = 0;
      got = static_cast<long>(::read(server_end, &c, 1));
    }
  });
  int accepted = 0;
  {
    ListenerWake wake("0.0.0.0", port);
    EXPECT_TRUE(cxlkv::testing::Eventually(
        [&] {
          pollfd p{l, POLLIN, 0};
          if (::poll(&p, 1, 0) != 1) return false;
          const int c = ::accept(l, nullptr, nullptr);
          if (c >= 0) {
            ::close(c);
            ++accepted;
          }
          return accepted >= 2;
        },
        std::chrono::seconds(30), std::chrono::milliseconds(1)));
    // The wake's thread counts a connection after it completed (and the listener may have
    // accepted it already): a descheduled thread counts it a little later.
    EXPECT_TRUE(cxlkv::testing::Eventually([&] { return wake.connects() >= 2; },
                                           std::chrono::seconds(30), std::chrono::milliseconds(1)))
        << wake.connects();
    waiter.join();
  }
  EXPECT_EQ(got, 0) << "the idle connection's reader was not woken by the end of its input";
  // The client's own socket still reads (nothing sent, so it would block: it is writable).
  pollfd p{client, POLLOUT | POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 1);
  EXPECT_EQ(p.revents & POLLIN, 0);
  ::close(client);
  ::close(server_end);
  ::close(l);
  // Nothing listens: no connection is made, and the destructor still returns.
  { ListenerWake idle("", 0); }
}

}  // namespace
}  // namespace cxlkv::base
