// base/: byte counts (ParseSize, FormatBytes), errno as text and Status, the TOML reader.
#include <cerrno>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "cxlkv/base/bytes.h"
#include "cxlkv/base/errno.h"
#include "cxlkv/base/mutex.h"
#include "cxlkv/base/toml_reader.h"
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

}  // namespace
}  // namespace cxlkv::base
