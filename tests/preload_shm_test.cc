// The preload shim's support for modern vLLM's CPU offload region, without LD_PRELOAD:
//   - the settings CXLKV_SHM and CXLKV_REGISTER_CHUNK;
//   - cudaHostRegister split into chunks (host_register.h): boundaries, each result checked,
//     the chunks done undone on a refusal, every chunk unregistered;
//   - ShmBacking (shm_backing.h) on real files: a devdax-like file pool whose extent backs a
//     /dev/shm file for several processes, the sidecar record, the pool's own statistics,
//     freeing when the file is gone and nobody maps it (and not before), a full pool, a
//     mapping beyond the extent; a kmem node binding the file's pages.
// The shim itself under a vLLM-like program is tests/preload/shm_offload.py; the kmem node of
// a CXL device in QEMU is qemu-cxl/guest-tests/vllm-offload.sh.
#include <dirent.h>
#include <fcntl.h>
#include <numaif.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "cxlkv/pool/arena.h"
#include "cxlkv/preload/host_register.h"
#include "cxlkv/preload/layout.h"
#include "cxlkv/preload/settings.h"
#include "cxlkv/preload/shm_backing.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace cxlkv::preload {
namespace {

using cxlkv::testing::ShmPath;

Settings Load(const std::vector<std::string>& env, std::vector<std::string>* errors) {
  std::vector<const char*> envp;
  envp.reserve(env.size() + 1);
  for (const auto& e : env) envp.push_back(e.c_str());
  envp.push_back(nullptr);
  return LoadSettings(envp.data(), errors);
}

// ---- settings ---------------------------------------------------------------------------------

TEST(ShmSettings, GlobAndChunk) {
  std::vector<std::string> errors;
  Settings s = Load({"CXLKV_POOL=file:/dev/shm/p?size=64M", "CXLKV_SHM=/dev/shm/vllm_offload_*",
                     "CXLKV_REGISTER_CHUNK=1G"},
                    &errors);
  ASSERT_TRUE(errors.empty()) << errors[0];
  EXPECT_EQ(s.shm_glob, "/dev/shm/vllm_offload_*");
  EXPECT_EQ(s.register_chunk_bytes, 1ull << 30);
  errors.clear();
  s = Load({"CXLKV_POOL=kmem:node=2"}, &errors);
  EXPECT_TRUE(errors.empty());
  EXPECT_TRUE(s.shm_glob.empty());
  EXPECT_EQ(s.register_chunk_bytes, 64ull << 30) << "the default is gpu/'s 64 GiB rule";
}

TEST(ShmSettings, BadValuesNameTheFix) {
  struct Case {
    std::vector<std::string> env;
    const char* want;
  };
  const Case cases[] = {
      {{"CXLKV_POOL=file:/dev/shm/p", "CXLKV_SHM=vllm_offload_*"}, "absolute paths"},
      {{"CXLKV_POOL=memfd:?size=1M", "CXLKV_SHM=/dev/shm/x*"}, "needs a pool every process"},
      {{"CXLKV_SHM=/dev/shm/x*"}, "it is unset"},
      {{"CXLKV_REGISTER_CHUNK=0"}, "below 512G"},
      {{"CXLKV_REGISTER_CHUNK=512G"}, "r580"},
      {{"CXLKV_REGISTER_CHUNK=600G"}, "r580"},
      {{"CXLKV_REGISTER_CHUNK=1000"}, "multiple of 4K"},
      {{"CXLKV_REGISTER_CHUNK=lots"}, "e.g. 64G"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> errors;
    std::vector<std::string> env = c.env;
    const Settings s = Load(env, &errors);
    ASSERT_EQ(errors.size(), 1u) << env.back();
    EXPECT_NE(errors[0].find(c.want), std::string::npos) << errors[0];
    EXPECT_TRUE(s.pool.empty()) << "a bad setting turns the shim off";
  }
  // A near miss of the new key is caught like the others.
  std::vector<std::string> errors;
  Load({"CXLKV_POOL=memfd:?size=1M", "CXLKV_SHMM=/dev/shm/x"}, &errors);
  EXPECT_EQ(errors.size(), 1u);
}

// ---- chunked cudaHostRegister ------------------------------------------------------------------

// The runtime's two calls, recorded; register refuses chunk `fail_at` (or never: -1).
struct Driver {
  struct Call {
    bool reg;
    std::uintptr_t addr;
    std::size_t bytes;
    unsigned flags;
    bool operator==(const Call&) const = default;
  };
  std::vector<Call> calls;
  int fail_at = -1;
  int unregister_error_at = -1;
  int registered = 0;
  HostRegisterOps ops() {
    return HostRegisterOps{
        [](void* ctx, void* a, std::size_t n, unsigned f) {
          auto* d = static_cast<Driver*>(ctx);
          d->calls.push_back({true, reinterpret_cast<std::uintptr_t>(a), n, f});
          return d->registered++ == d->fail_at ? 712
                                               : 0;  // cudaErrorHostMemoryAlreadyRegistered-ish
        },
        [](void* ctx, void* a) {
          auto* d = static_cast<Driver*>(ctx);
          d->calls.push_back({false, reinterpret_cast<std::uintptr_t>(a), 0, 0});
          return static_cast<int>(d->calls.size()) - 1 == d->unregister_error_at ? 4 : 0;
        },
        this};
  }
};

TEST(HostRegister, SplitsIntoChunksOfTheLimitWithTheRemainderLast) {
  Driver d;
  const std::uintptr_t base = 0x7f0000000000;
  const std::size_t bytes = (10u << 20) + 4096;
  const auto r = RegisterInChunks(reinterpret_cast<void*>(base), bytes, 0, 4u << 20, d.ops());
  EXPECT_EQ(r.error, 0);
  EXPECT_EQ(r.chunks, 3u);
  EXPECT_EQ(d.calls, (std::vector<Driver::Call>{{true, base, 4u << 20, 0},
                                                {true, base + (4u << 20), 4u << 20, 0},
                                                {true, base + (8u << 20), (2u << 20) + 4096, 0}}));
  EXPECT_EQ(RegisterChunkCount(bytes, 4u << 20), 3u);
  EXPECT_EQ(RegisterChunkCount(8u << 20, 4u << 20), 2u);
  EXPECT_EQ(RegisterChunkCount(1, 4u << 20), 1u);
  // 1 TiB at the default 64 GiB: 16 calls, none of them near the driver's 512 GiB limit.
  EXPECT_EQ(RegisterChunkCount(1ull << 40, kDefaultRegisterChunkBytes), 16u);
}

TEST(HostRegister, ARefusalUndoesTheChunksDoneNewestFirstAndIsReturned) {
  Driver d;
  d.fail_at = 2;
  const std::uintptr_t base = 0x10000000;
  const auto r = RegisterInChunks(reinterpret_cast<void*>(base), 5u << 20, 3, 1u << 20, d.ops());
  EXPECT_EQ(r.error, 712);
  EXPECT_EQ(r.failed, 2u);
  EXPECT_EQ(d.calls, (std::vector<Driver::Call>{{true, base, 1u << 20, 3},
                                                {true, base + (1u << 20), 1u << 20, 3},
                                                {true, base + (2u << 20), 1u << 20, 3},
                                                {false, base + (1u << 20), 0, 0},
                                                {false, base, 0, 0}}))
      << "the caller is told 'refused': nothing of the range may stay pinned";
  Driver first;
  first.fail_at = 0;
  const auto r0 =
      RegisterInChunks(reinterpret_cast<void*>(base), 5u << 20, 0, 1u << 20, first.ops());
  EXPECT_EQ(r0.error, 712);
  EXPECT_EQ(first.calls.size(), 1u) << "nothing done, nothing to undo";
}

TEST(HostRegister, UnregisterUndoesEveryChunkEvenAfterAnError) {
  Driver d;
  d.unregister_error_at = 1;
  const std::uintptr_t base = 0x20000000;
  EXPECT_EQ(UnregisterChunks(reinterpret_cast<void*>(base), 3u << 20, 1u << 20, d.ops()), 4);
  EXPECT_EQ(d.calls, (std::vector<Driver::Call>{{false, base, 0, 0},
                                                {false, base + (1u << 20), 0, 0},
                                                {false, base + (2u << 20), 0, 0}}));
}

// ---- shared-memory files on an extent of a file pool --------------------------------------------

TEST(ShmBacking, GlobMatchesPathsNotAcrossDirectories) {
  EXPECT_TRUE(ShmPathMatches("/dev/shm/vllm_offload_*", "/dev/shm/vllm_offload_abc.mmap"));
  EXPECT_FALSE(ShmPathMatches("/dev/shm/vllm_offload_*", "/dev/shm/other"));
  EXPECT_FALSE(ShmPathMatches("/dev/shm/*", "/dev/shm/sub/file"));
  EXPECT_FALSE(ShmPathMatches("/dev/shm/vllm_offload_*", "/tmp/vllm_offload_x"));
}

TEST(ShmBacking, CreateRefusesWhatCannotBeShared) {
  auto memfd = ShmBacking::Create(*pool::ParseSourceSpec("memfd:?size=1M"), "/dev/shm/x*");
  ASSERT_FALSE(memfd.ok());
  EXPECT_NE(memfd.status().message().find("private to this process tree"), std::string::npos);
  auto node = ShmBacking::Create(*pool::ParseSourceSpec("kmem:node=999"), "/dev/shm/x*");
  ASSERT_FALSE(node.ok());
  EXPECT_NE(node.status().message().find("no NUMA node 999"), std::string::npos);
  EXPECT_FALSE(ShmBacking::Create(*pool::ParseSourceSpec("file:/dev/shm/p"), "x*").ok());
}

// A pool, a glob that matches this test's files only, and helpers to make vLLM's file.
class ShmExtent : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = "/dev/shm/cxlkv-shmtest-" + std::to_string(::getpid()) + "-";
    pool_spec_ = pool_.spec("16M") + "&reserve=0";
  }
  void TearDown() override {
    for (const std::string& f : files_) ::unlink(f.c_str());
    // Sidecars of this test's files (a failed test may leave some).
    const std::string mine = ".cxlkv-shmtest-" + std::to_string(::getpid()) + "-";
    if (DIR* d = ::opendir("/dev/shm")) {
      std::vector<std::string> names;
      while (const dirent* e = ::readdir(d)) {
        if (std::string(e->d_name).rfind(mine, 0) == 0) names.emplace_back(e->d_name);
      }
      ::closedir(d);
      for (const std::string& n : names) ::unlink(("/dev/shm/" + n).c_str());
    }
  }
  std::unique_ptr<ShmBacking> Backing() {
    auto b = ShmBacking::Create(*pool::ParseSourceSpec(pool_spec_), prefix_ + "vllm_offload_*");
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? *std::move(b) : nullptr;
  }
  // Creates (O_EXCL) and ftruncates the file; returns an open descriptor.
  int MakeFile(const std::string& name, std::size_t bytes) {
    const std::string p = prefix_ + name;
    files_.push_back(p);
    const int fd = ::open(p.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0) << "errno " << errno;
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
    return fd;
  }
  // The pool's statistics, from a read-only view of its arena.
  pool::ClassUsage Usage() {
    pool::OpenOptions o;
    o.read_only = true;
    auto a = pool::Arena::Open(testing::MustOpen(pool_.spec()), o);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? (*a)->Usage().classes[0] : pool::ClassUsage{};
  }
  static ShmBindingRecord Record(const std::string& file) {
    struct statx sx {};
    EXPECT_EQ(::statx(AT_FDCWD, file.c_str(), 0, STATX_INO | STATX_BTIME, &sx), 0);
    const std::int64_t bt =
        (sx.stx_mask & STATX_BTIME) != 0
            ? static_cast<std::int64_t>(sx.stx_btime.tv_sec) * 1000000000 + sx.stx_btime.tv_nsec
            : 0;
    ShmBindingRecord rec{};
    const int fd = ::open(ShmSidecarPath(file, sx.stx_ino, bt).c_str(), O_RDONLY | O_CLOEXEC);
    EXPECT_GE(fd, 0) << "no sidecar for " << file;
    if (fd >= 0) {
      EXPECT_EQ(::pread(fd, &rec, sizeof(rec), 0), static_cast<ssize_t>(sizeof(rec)));
      ::close(fd);
    }
    return rec;
  }
  std::string SidecarOf(const std::string& file) {
    struct statx sx {};
    if (::statx(AT_FDCWD, file.c_str(), 0, STATX_INO | STATX_BTIME, &sx) != 0) return "";
    const std::int64_t bt =
        (sx.stx_mask & STATX_BTIME) != 0
            ? static_cast<std::int64_t>(sx.stx_btime.tv_sec) * 1000000000 + sx.stx_btime.tv_nsec
            : 0;
    return ShmSidecarPath(file, sx.stx_ino, bt);
  }

  ShmPath pool_{"shm-pool"};
  std::string pool_spec_, prefix_;
  std::vector<std::string> files_;
};

unsigned char Pat(int who, std::size_t i) {
  return static_cast<unsigned char>(static_cast<std::size_t>(who) * 31 + i * 7 + 1);
}

TEST_F(ShmExtent, TheFileLivesInAnExtentEveryProcessMaps) {
  constexpr std::size_t kBytes = 3u << 20;
  const int fd = MakeFile("vllm_offload_a.mmap", kBytes);
  auto b = Backing();
  ASSERT_NE(b, nullptr);
  const auto m = b->Map(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_EQ(m.outcome, ShmBacking::Outcome::kMapped) << m.err;
  ASSERT_TRUE(m.bound);
  auto* p = static_cast<unsigned char*>(m.addr);
  for (std::size_t i = 0; i < kBytes; ++i) ASSERT_EQ(p[i], 0) << "a new file reads as zeros";
  for (std::size_t i = 0; i < kBytes; ++i) p[i] = Pat(1, i);

  // The record, and the pool's statistics: 12 blocks of 256 KiB persisted for the file.
  const ShmBindingRecord rec = Record(prefix_ + "vllm_offload_a.mmap");
  ASSERT_EQ(rec.state, static_cast<std::uint32_t>(ShmBindingState::kBound));
  EXPECT_EQ(rec.block_count, 12u);
  EXPECT_EQ(rec.extent_bytes, kBytes);
  EXPECT_EQ(Usage().persisted, 12u);
  // The bytes are in the pool file at the recorded offset, and not in the file.
  {
    const int pfd = ::open(pool_.path().c_str(), O_RDONLY | O_CLOEXEC);
    std::vector<unsigned char> got(kBytes);
    ASSERT_EQ(::pread(pfd, got.data(), kBytes, static_cast<off_t>(rec.source_offset)),
              static_cast<ssize_t>(kBytes));
    ::close(pfd);
    for (std::size_t i = 0; i < kBytes; i += 4093) ASSERT_EQ(got[i], Pat(1, i)) << i;
    struct stat st {};
    ASSERT_EQ(::fstat(fd, &st), 0);
    EXPECT_EQ(st.st_blocks, 0) << "the shm file itself got pages";
  }

  // Another process (its own backing, as a second vLLM worker) maps the same memory.
  const pid_t child = ::fork();
  if (child == 0) {
    auto cb = ShmBacking::Create(*pool::ParseSourceSpec(pool_spec_), prefix_ + "vllm_offload_*");
    const int cfd = ::open((prefix_ + "vllm_offload_a.mmap").c_str(), O_RDWR);
    if (!cb.ok() || cfd < 0) ::_exit(10);
    const auto cm = (*cb)->Map(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, cfd, 0);
    if (cm.outcome != ShmBacking::Outcome::kMapped || !cm.bound) ::_exit(11);
    auto* q = static_cast<unsigned char*>(cm.addr);
    for (std::size_t i = 0; i < kBytes; ++i) {
      if (q[i] != Pat(1, i)) ::_exit(13);
    }
    std::memset(q + (1u << 20), 0xA5, 4096);  // a second worker's write
    ::munmap(q, kBytes);
    (*cb)->Unmapped(q, kBytes);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_EQ(p[1u << 20], 0xA5) << "the other process's write is in this mapping";
  EXPECT_EQ(Usage().persisted, 12u) << "the file still exists: the extent stays";

  // Unmapped while the file exists: kept (vLLM maps again after a restart of a worker).
  ASSERT_EQ(::munmap(p, kBytes), 0);
  b->Unmapped(p, kBytes);
  EXPECT_EQ(Usage().persisted, 12u);
  // The file goes: nobody maps it, the extent is freed and the sidecar removed.
  const std::string file = prefix_ + "vllm_offload_a.mmap";
  const std::string sidecar = SidecarOf(file);
  struct stat before {};
  ASSERT_EQ(::lstat(file.c_str(), &before), 0);
  ASSERT_EQ(::unlink(file.c_str()), 0);
  b->Unlinked(AT_FDCWD, file.c_str(), before);
  EXPECT_EQ(Usage().persisted, 0u);
  EXPECT_NE(::access(sidecar.c_str(), F_OK), 0) << sidecar << " left behind";
  ::close(fd);
}

TEST_F(ShmExtent, AnExtentStaysWhileAnyProcessMapsItAndGoesAfter) {
  constexpr std::size_t kBytes = 1u << 20;
  const std::string file = prefix_ + "vllm_offload_held.mmap";
  const int fd = MakeFile("vllm_offload_held.mmap", kBytes);
  int up[2], down[2];  // child -> parent: "mapped"; parent -> child: "exit now"
  ASSERT_EQ(::pipe(up), 0);
  ASSERT_EQ(::pipe(down), 0);
  const pid_t child = ::fork();
  if (child == 0) {  // maps and holds it until told, then exits without unmapping
    ::close(up[0]);
    ::close(down[1]);
    auto cb = ShmBacking::Create(*pool::ParseSourceSpec(pool_spec_), prefix_ + "vllm_offload_*");
    if (!cb.ok()) ::_exit(10);
    const auto cm = (*cb)->Map(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (!cm.bound) ::_exit(11);
    static_cast<unsigned char*>(cm.addr)[0] = 7;
    char c;
    (void)!::write(up[1], "m", 1);
    (void)!::read(down[0], &c, 1);
    ::_exit(0);
  }
  ::close(up[1]);
  ::close(down[0]);
  char c;
  ASSERT_EQ(::read(up[0], &c, 1), 1) << "the child did not map the file";
  auto b = Backing();
  struct stat before {};
  ASSERT_EQ(::lstat(file.c_str(), &before), 0);
  const std::string sidecar = SidecarOf(file);
  ASSERT_EQ(::unlink(file.c_str()), 0);
  b->Unlinked(AT_FDCWD, file.c_str(), before);
  EXPECT_EQ(Usage().persisted, 4u) << "freed while another process maps it";
  ASSERT_EQ(::write(down[1], "x", 1), 1);
  ::close(down[1]);
  ::close(up[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  // The mapper died without unmapping: its lock went with it; the next look frees the extent.
  EXPECT_EQ(b->CollectGarbage("/dev/shm"), 1u);
  EXPECT_EQ(Usage().persisted, 0u);
  EXPECT_NE(::access(sidecar.c_str(), F_OK), 0);
  ::close(fd);
}

// Another process's collector, run once in the window between a binding's open of its
// sidecar and its lock (ShmBacking::SetBeforeSidecarLockHookForTesting).
ShmBacking* g_collector = nullptr;
int g_window_calls = 0;
void CollectInTheWindowOnce() {
  if (g_window_calls++ == 0 && g_collector != nullptr) g_collector->CollectGarbage("/dev/shm");
}

// A process descheduled between its sidecar's open and lock, while another process's
// collector finds the sidecar empty and removes it: the binding must land in the sidecar every
// process opens. It used to be written into the removed file, and the next process bound the
// same file to another extent (two vLLM workers, two copies of one region). Seen under TSan,
// where the window is wide; the hook makes it certain.
TEST_F(ShmExtent, ASidecarRemovedBeforeItsLockIsMadeAgain) {
  constexpr std::size_t kBytes = 1u << 20;
  const int fd = MakeFile("vllm_offload_r.mmap", kBytes);
  auto a = Backing();
  auto other = Backing();
  ASSERT_NE(a, nullptr);
  ASSERT_NE(other, nullptr);
  g_collector = other.get();
  g_window_calls = 0;
  ShmBacking::SetBeforeSidecarLockHookForTesting(&CollectInTheWindowOnce);
  const auto m = a->Map(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ShmBacking::SetBeforeSidecarLockHookForTesting(nullptr);
  g_collector = nullptr;
  ASSERT_EQ(m.outcome, ShmBacking::Outcome::kMapped) << m.err;
  ASSERT_TRUE(m.bound);
  EXPECT_GE(g_window_calls, 2) << "the binding did not open the sidecar again";
  const ShmBindingRecord rec = Record(prefix_ + "vllm_offload_r.mmap");
  ASSERT_EQ(rec.state, static_cast<std::uint32_t>(ShmBindingState::kBound))
      << "the binding went into a sidecar the collector had removed";
  // Another process maps the file: the same extent, so it sees this mapping's bytes.
  auto* p = static_cast<unsigned char*>(m.addr);
  for (std::size_t i = 0; i < kBytes; i += 4096) p[i] = Pat(3, i);
  const auto m2 = other->Map(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_EQ(m2.outcome, ShmBacking::Outcome::kMapped) << m2.err;
  auto* q = static_cast<unsigned char*>(m2.addr);
  for (std::size_t i = 0; i < kBytes; i += 4096) ASSERT_EQ(q[i], Pat(3, i)) << i;
  EXPECT_EQ(Usage().persisted, 4u) << "one extent of 4 blocks for the file, not two";
  ASSERT_EQ(::munmap(q, kBytes), 0);
  other->Unmapped(q, kBytes);
  ASSERT_EQ(::munmap(p, kBytes), 0);
  a->Unmapped(p, kBytes);
  ::close(fd);
}

TEST_F(ShmExtent, AFileRemovedBehindTheShimsBackIsCollectedAtTheNextBinding) {
  constexpr std::size_t kBytes = 1u << 20;
  {
    const int fd = MakeFile("vllm_offload_old.mmap", kBytes);
    const pid_t child = ::fork();
    if (child == 0) {  // a worker that dies holding the mapping
      auto cb = ShmBacking::Create(*pool::ParseSourceSpec(pool_spec_), prefix_ + "vllm_offload_*");
      if (!cb.ok() || !(*cb)->Map(nullptr, kBytes, PROT_READ, MAP_SHARED, fd, 0).bound) ::_exit(11);
      ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ::close(fd);
  }
  ASSERT_EQ(Usage().persisted, 4u);
  ::unlink((prefix_ + "vllm_offload_old.mmap").c_str());  // `rm` of a stale region: no shim
  auto b = Backing();
  const int fd = MakeFile("vllm_offload_new.mmap", kBytes);
  const auto m = b->Map(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_TRUE(m.bound);
  EXPECT_EQ(Usage().persisted, 4u) << "the old file's extent was not collected";
  ::munmap(m.addr, kBytes);
  b->Unmapped(m.addr, kBytes);
  ::close(fd);
}

TEST_F(ShmExtent, AFullPoolLeavesTheFileToEveryProcessAlike) {
  const int fd = MakeFile("vllm_offload_big.mmap", 64u << 20);  // the pool holds 16 MiB
  auto b = Backing();
  const auto m = b->Map(nullptr, 64u << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  EXPECT_EQ(m.outcome, ShmBacking::Outcome::kNotMatched);
  EXPECT_TRUE(m.matched);
  const ShmBindingRecord rec = Record(prefix_ + "vllm_offload_big.mmap");
  EXPECT_EQ(rec.state, static_cast<std::uint32_t>(ShmBindingState::kPassThrough));
  EXPECT_NE(std::string(rec.reason).find("no free run of 64 MiB"), std::string::npos) << rec.reason;
  // Space freed later changes nothing for this file: the others map the file too.
  auto again = Backing();
  EXPECT_EQ(again->Map(nullptr, 1u << 20, PROT_READ, MAP_SHARED, fd, 0).outcome,
            ShmBacking::Outcome::kNotMatched);
  EXPECT_EQ(Usage().persisted, 0u);
  ::close(fd);
}

TEST_F(ShmExtent, MappingsBeyondTheExtentOrOfOtherFilesAreRefusedOrLeftAlone) {
  const int fd = MakeFile("vllm_offload_c.mmap", 1u << 20);
  auto b = Backing();
  const auto first = b->Map(nullptr, 1u << 20, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT_TRUE(first.bound);
  ASSERT_EQ(::ftruncate(fd, 2u << 20), 0);  // grown after the binding
  const auto beyond = b->Map(nullptr, 2u << 20, PROT_READ, MAP_SHARED, fd, 0);
  EXPECT_EQ(beyond.outcome, ShmBacking::Outcome::kFailed);
  EXPECT_EQ(beyond.err, EINVAL);
  // A window inside the extent is the same memory at the same offset.
  const auto window = b->Map(nullptr, 4096, PROT_READ, MAP_SHARED, fd, 8192);
  ASSERT_EQ(window.outcome, ShmBacking::Outcome::kMapped);
  static_cast<unsigned char*>(first.addr)[8192 + 5] = 99;
  EXPECT_EQ(static_cast<unsigned char*>(window.addr)[5], 99);
  // Not matching the glob: left alone.
  const int other = MakeFile("something_else", 4096);
  EXPECT_EQ(b->Map(nullptr, 4096, PROT_READ, MAP_SHARED, other, 0).outcome,
            ShmBacking::Outcome::kNotMatched);
  EXPECT_FALSE(b->Map(nullptr, 4096, PROT_READ, MAP_SHARED, other, 0).matched);
  ::munmap(first.addr, 1u << 20);
  ::munmap(window.addr, 4096);
  ::close(other);
  ::close(fd);
}

// ---- kmem: the file's own pages bound to the node ---------------------------------------------

// A NUMA node other than 0 with memory, or -1.
int SecondMemoryNode() {
  for (int n = 1; n < 64; ++n) {
    const std::string meminfo = "/sys/devices/system/node/node" + std::to_string(n) + "/meminfo";
    if (::access(meminfo.c_str(), R_OK) == 0) return n;
  }
  return -1;
}

void CheckKmemBinding(int node, int populate_flags) {
  SCOPED_TRACE("node " + std::to_string(node));
  ShmPath file("kmem-vllm_offload");
  const int fd = ::open(file.path().c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  constexpr std::size_t kBytes = 2u << 20;
  ASSERT_EQ(::ftruncate(fd, kBytes), 0);
  auto b = ShmBacking::Create(*pool::ParseSourceSpec("kmem:node=" + std::to_string(node)),
                              "/dev/shm/cxlkv-test-kmem-vllm_offload-*");
  ASSERT_TRUE(b.ok()) << b.status();
  const auto m =
      (*b)->Map(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED | populate_flags, fd, 0);
  ASSERT_EQ(m.outcome, ShmBacking::Outcome::kMapped);
  EXPECT_TRUE(m.bound);
  auto* p = static_cast<unsigned char*>(m.addr);
  if (populate_flags == 0) {
    ASSERT_EQ(::madvise(p, kBytes, 23 /* MADV_POPULATE_WRITE */), 0) << "errno " << errno;
  }
  int mode = -1;
  unsigned long mask[16] = {};
  ASSERT_EQ(get_mempolicy(&mode, mask, 1024, p, MPOL_F_ADDR), 0);
  EXPECT_EQ(mode, MPOL_BIND);
  EXPECT_EQ(mask[node / 64], 1ul << (node % 64));
  std::vector<void*> pages;
  for (std::size_t off = 0; off < kBytes; off += 4096) pages.push_back(p + off);
  std::vector<int> status(pages.size(), -1);
  ASSERT_EQ(move_pages(0, pages.size(), pages.data(), nullptr, status.data(), 0), 0);
  for (std::size_t i = 0; i < status.size(); ++i) ASSERT_EQ(status[i], node) << "page " << i;
  // Another mapping of the file, unbound (not through the backing), gets its pages from the
  // file: the policy is the file's, not the first mapping's.
  void* q = ::mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(q, MAP_FAILED);
  ASSERT_EQ(get_mempolicy(&mode, mask, 1024, q, MPOL_F_ADDR), 0);
  EXPECT_EQ(mode, MPOL_BIND) << "tmpfs keeps the policy with the file";
  ::munmap(q, kBytes);
  ::munmap(p, kBytes);
  ::close(fd);
}

TEST(ShmKmem, TheFilesPagesAreBoundToTheNodeBeforeTheyArePopulated) {
  CheckKmemBinding(0, 0);
  CheckKmemBinding(0, MAP_POPULATE);  // older vLLM: MAP_POPULATE, done after the binding
  const int other = SecondMemoryNode();
  if (other < 0) {
    GTEST_SKIP() << "one NUMA node with memory here: the binding is checked on node 0 only "
                    "(the pages land on a CXL node in qemu-cxl/guest-tests/vllm-offload.sh)";
  }
  CheckKmemBinding(other, 0);
  CheckKmemBinding(other, MAP_POPULATE);
}

}  // namespace
}  // namespace cxlkv::preload
