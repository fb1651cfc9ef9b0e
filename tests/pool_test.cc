// pool/: source specs, region backends, arena format/open and every bad-input path.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <tuple>
#include <vector>

#include "cache_trace.h"
#include "cxlkv/coherence/cache.h"
#include "cxlkv/pool/arena.h"
#include "cxlkv/pool/kv_layout.h"
#include "cxlkv/pool/region.h"
#include "cxlkv/pool/spec.h"
#include "gtest/gtest.h"
#include "test_util.h"

namespace cxlkv::pool {
namespace {

using cxlkv::testing::MustFormat;
using cxlkv::testing::MustOpen;
using cxlkv::testing::ShmPath;
using cxlkv::testing::TinyLayout;

bool Mentions(const absl::Status& st, absl::string_view text) {
  return st.message().find(text) != absl::string_view::npos;
}

TEST(Spec, ParsesEveryKindAndRoundTrips) {
  struct Case {
    const char* text;
    SourceKind kind;
    std::uint64_t size;
  } cases[] = {
      {"devdax:/dev/dax0.0", SourceKind::kDevdax, 0},
      {"kmem:node=2", SourceKind::kKmem, 0},
      {"kmem:node=1?size=4G", SourceKind::kKmem, 4ull << 30},
      {"file:/dev/shm/pool0?size=8G", SourceKind::kFile, 8ull << 30},
      {"file:/tmp/x?size=64M&reserve=0", SourceKind::kFile, 64ull << 20},
      {"memfd:?size=1T", SourceKind::kMemfd, 1ull << 40},
      {"memfd:kv?size=512K", SourceKind::kMemfd, 512ull << 10},
      {"devdax:/dev/dax1.0?shared=1", SourceKind::kDevdax, 0},
  };
  for (const auto& c : cases) {
    auto s = ParseSourceSpec(c.text);
    ASSERT_TRUE(s.ok()) << c.text << ": " << s.status();
    EXPECT_EQ(s->kind, c.kind) << c.text;
    EXPECT_EQ(s->size_bytes, c.size) << c.text;
    auto again = ParseSourceSpec(s->ToString());
    ASSERT_TRUE(again.ok()) << s->ToString();
    EXPECT_EQ(*again, *s) << c.text << " -> " << s->ToString();
  }
  EXPECT_TRUE(ParseSourceSpec("devdax:/dev/dax1.0?shared=1")->shared);
  EXPECT_FALSE(ParseSourceSpec("file:/a?size=4K&reserve=0")->reserve);
}

TEST(Spec, RejectsBadSpecsWithTheFix) {
  for (const char* bad :
       {"", "dax0.0", "nvme:/dev/nvme0", "devdax:dax0.0", "devdax:/dev/dax0.0?size=1G", "kmem:2",
        "kmem:node=-1", "kmem:node=x", "file:", "file:/x?size=", "file:/x?size=12Q",
        "file:/x?size=0", "file:/x?colour=red", "file:/x?size",
        "memfd:", "memfd:?size=99999999999T", "file:/x?reserve=maybe"}) {
    auto s = ParseSourceSpec(bad);
    ASSERT_FALSE(s.ok()) << "accepted: " << bad;
    EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << bad;
    EXPECT_TRUE(Mentions(s.status(), "accepted forms")) << s.status();
  }
}

TEST(KvLayout, Llama3_70BBlockIsFiveMiB) {
  const KvLayout l = Llama3_70B();
  EXPECT_EQ(l.BytesPerToken(), 320u * 1024);
  EXPECT_EQ(l.BlockBytes(), 5u << 20);
  EXPECT_EQ(*ParseKvLayout("L=80,H=8,D=128,B=2,T=16"), l);
  EXPECT_TRUE(ParseKvLayout("llama3-8b").ok());
  EXPECT_FALSE(ParseKvLayout("L=80,H=8,D=128,B=3,T=16").ok());
  EXPECT_FALSE(ParseKvLayout("gpt-17").ok());
  EXPECT_FALSE(ParseKvLayout("L=1,H=1,D=1,B=1,T=1").ok());  // 2 bytes: not 64-byte multiple
}

TEST(Region, MemfdAndFileBackends) {
  auto m = MustOpen("memfd:?size=8M");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->size_bytes(), 8u << 20);
  std::memset(m->addr(), 0xAB, m->size_bytes());

  ShmPath p("region");
  {
    auto f = MustOpen(p.spec("4M"));
    ASSERT_NE(f, nullptr);
    f->addr()[123] = std::byte{7};
  }
  auto again = MustOpen(p.spec());  // size taken from the existing file
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->size_bytes(), 4u << 20);
  EXPECT_EQ(again->addr()[123], std::byte{7});
}

// One extent of a pooled region: the window maps exactly its bytes of the source, an arena
// formatted in it stays inside, and bad windows are named.
TEST(Region, WindowMapsOneExtentOfTheSource) {
  ShmPath p("window");
  auto whole = MustOpen(p.spec("8M"));
  ASSERT_NE(whole, nullptr);
  auto w = MustOpen(p.spec() + "?offset=2M&length=4M");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->size_bytes(), 4u << 20);
  EXPECT_EQ(w->spec().offset, 2u << 20);
  w->addr()[0] = std::byte{0x5A};
  w->addr()[(4 << 20) - 1] = std::byte{0xA5};
  EXPECT_EQ(whole->addr()[2 << 20], std::byte{0x5A});
  EXPECT_EQ(whole->addr()[(6 << 20) - 1], std::byte{0xA5});
  auto dup = w->Duplicate();
  ASSERT_TRUE(dup.ok()) << dup.status();
  EXPECT_EQ((*dup)->addr()[0], std::byte{0x5A}) << "a duplicate maps the same window";
  // An arena in the window: the bytes around it are untouched.
  std::memset(whole->addr() + (2 << 20), 0, 4 << 20);
  std::memset(whole->addr(), 0x11, 2 << 20);
  std::memset(whole->addr() + (6 << 20), 0x22, 2 << 20);
  {
    FormatOptions o;
    o.layout = TinyLayout();
    auto a = Arena::Format(MustOpen(p.spec() + "?offset=2M&length=4M"), o);
    ASSERT_TRUE(a.ok()) << a.status();
  }
  for (std::size_t i = 0; i < (2u << 20); ++i) {
    ASSERT_EQ(whole->addr()[i], std::byte{0x11}) << "byte " << i << " before the window";
    ASSERT_EQ(whole->addr()[(6u << 20) + i], std::byte{0x22}) << "byte after the window";
  }
  auto reopened = Arena::Open(MustOpen(p.spec() + "?offset=2M&length=4M"));
  EXPECT_TRUE(reopened.ok()) << reopened.status();

  auto spec = ParseSourceSpec(p.spec() + "?offset=2M&length=4M");
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(ParseSourceSpec(spec->ToString()).value(), *spec) << spec->ToString();
  const auto misaligned = OpenRegion(p.spec() + "?offset=4096&length=2M");
  EXPECT_TRUE(absl::IsInvalidArgument(misaligned.status())) << misaligned.status();
  EXPECT_NE(misaligned.status().message().find("2 MiB"), std::string::npos);
  const auto past = OpenRegion(p.spec() + "?offset=6M&length=4M");
  EXPECT_TRUE(absl::IsOutOfRange(past.status())) << past.status();
  EXPECT_NE(past.status().message().find("past the end"), std::string::npos);
  EXPECT_FALSE(ParseSourceSpec(p.spec() + "?offset=2M").ok()) << "offset without length";
  EXPECT_FALSE(ParseSourceSpec("memfd:?size=8M&offset=2M&length=2M").ok())
      << "a memfd has no window";
}

TEST(Region, KmemBindsToANode) {
  auto r = OpenRegion("kmem:node=0?size=4M");
  if (!r.ok() && absl::IsFailedPrecondition(r.status())) GTEST_SKIP() << r.status();
  ASSERT_TRUE(r.ok()) << r.status();
  std::memset((*r)->addr(), 1, (*r)->size_bytes());
  auto missing = OpenRegion("kmem:node=63");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_TRUE(Mentions(missing.status(), "cxlkvctl topology"));
}

TEST(Region, BadInputsAreNamed) {
  auto none = OpenRegion("file:/dev/shm/cxlkv-no-such-file");
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(absl::IsNotFound(none.status()));
  EXPECT_TRUE(Mentions(none.status(), "?size=")) << none.status();

  auto dir = OpenRegion("file:/nonexistent-dir/x?size=1M");
  ASSERT_FALSE(dir.ok());
  EXPECT_TRUE(Mentions(dir.status(), "/nonexistent-dir/x")) << dir.status();

  auto misaligned = OpenRegion("memfd:?size=5000");
  ASSERT_FALSE(misaligned.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(misaligned.status()));
  EXPECT_TRUE(Mentions(misaligned.status(), "multiple")) << misaligned.status();

  ShmPath p("mismatch");
  { ASSERT_NE(MustOpen(p.spec("1M")), nullptr); }
  auto mismatch = OpenRegion(p.spec("2M"));
  ASSERT_FALSE(mismatch.ok());
  EXPECT_TRUE(Mentions(mismatch.status(), "drop size=")) << mismatch.status();

  auto notfile = OpenRegion("file:/dev/shm?size=1M");
  EXPECT_FALSE(notfile.ok());

  auto nodax = OpenRegion("devdax:/dev/dax9.9");
  ASSERT_FALSE(nodax.ok());
  EXPECT_TRUE(Mentions(nodax.status(), "/dev/dax9.9")) << nodax.status();
}

TEST(Region, PermissionDeniedNamesTheFile) {
  ShmPath p("perm");
  { ASSERT_NE(MustOpen(p.spec("1M")), nullptr); }
  // As root, a child drops to nobody and meets a 0600 root file; otherwise the owner meets
  // a 0000 file. Either way open(2) fails with EACCES.
  const bool root = ::geteuid() == 0;
  ASSERT_EQ(::chmod(p.path().c_str(), root ? 0600 : 0000), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (root && ::setresuid(65534, 65534, 65534) != 0) ::_exit(10);
    auto st = OpenRegion(p.spec());
    if (st.ok()) ::_exit(1);
    if (!absl::IsPermissionDenied(st.status())) ::_exit(2);
    if (!Mentions(st.status(), p.path())) ::_exit(3);
    if (!Mentions(st.status(), "owner and mode")) ::_exit(4);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

FormatOptions TinyOptions() {
  FormatOptions o;
  o.layout = TinyLayout();
  o.owner_slots = 16;
  return o;
}

TEST(Arena, FormatThenOpenSeesTheSameArena) {
  ShmPath p("fmt");
  Uuid uuid;
  {
    FormatOptions o = TinyOptions();
    o.classes = {{16, 0, 3}, {64, 0, 1}};  // 4 KiB and 16 KiB blocks
    auto a = MustFormat(p.spec("16M"), o);
    ASSERT_NE(a, nullptr);
    uuid = a->uuid();
    EXPECT_EQ(a->class_count(), 2u);
    EXPECT_EQ(a->class_record(0).block_bytes, 4096u);
    EXPECT_EQ(a->class_record(1).block_bytes, 16384u);
    const ArenaUsage u = a->Usage();
    EXPECT_EQ(u.owners_active, 1u);
    EXPECT_EQ(u.classes[0].free, u.classes[0].total);
    EXPECT_GT(u.classes[0].total, 2 * u.classes[1].total);
    EXPECT_LE(a->header().data_end_offset, a->region().size_bytes());
  }
  auto a = Arena::Open(MustOpen(p.spec()), OpenOptions{TinyLayout()});
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ((*a)->uuid(), uuid);
  EXPECT_EQ((*a)->layout(), TinyLayout());
}

TEST(Arena, DefaultClassIsTheLayoutBlock) {
  FormatOptions o;  // Llama-3-70B: 5 MiB blocks
  auto a = MustFormat("memfd:?size=64M", o);
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->class_record(0).block_bytes, 5u << 20);
  EXPECT_EQ(a->class_record(0).block_count, 12u);
}

TEST(Arena, RefusesToOverwriteWithoutForce) {
  ShmPath p("force");
  { ASSERT_NE(MustFormat(p.spec("8M"), TinyOptions()), nullptr); }
  auto again = Arena::Format(MustOpen(p.spec()), TinyOptions());
  ASSERT_FALSE(again.ok());
  EXPECT_TRUE(absl::IsAlreadyExists(again.status()));
  EXPECT_TRUE(Mentions(again.status(), "--force")) << again.status();

  FormatOptions forced = TinyOptions();
  forced.force = true;
  auto a = Arena::Format(MustOpen(p.spec()), forced);
  ASSERT_TRUE(a.ok()) << a.status();

  // In use by a live process (this one): refused even with force.
  auto busy = Arena::Format(MustOpen(p.spec()), forced);
  ASSERT_FALSE(busy.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(busy.status()));
  EXPECT_TRUE(Mentions(busy.status(), "in use by pid")) << busy.status();
}

TEST(Arena, ForeignDataIsNeverOverwrittenSilently) {
  ShmPath p("foreign");
  {
    auto r = MustOpen(p.spec("8M"));
    std::memcpy(r->addr(), "SQLite format 3", 16);
  }
  auto open = Arena::Open(MustOpen(p.spec()));
  ASSERT_FALSE(open.ok());
  EXPECT_TRUE(Mentions(open.status(), "foreign")) << open.status();
  auto fmt = Arena::Format(MustOpen(p.spec()), TinyOptions());
  ASSERT_FALSE(fmt.ok());
  EXPECT_TRUE(Mentions(fmt.status(), "--force")) << fmt.status();
  auto r = MustOpen(p.spec());
  EXPECT_EQ(std::memcmp(r->addr(), "SQLite format 3", 16), 0) << "foreign data was modified";
}

TEST(Arena, BlankAndInterruptedRegions) {
  auto blank = Arena::Open(MustOpen("memfd:?size=8M"));
  ASSERT_FALSE(blank.ok());
  EXPECT_TRUE(absl::IsNotFound(blank.status()));
  EXPECT_TRUE(Mentions(blank.status(), "format")) << blank.status();

  ShmPath p("interrupted");
  {
    auto r = MustOpen(p.spec("8M"));
    const std::uint64_t m = kFormattingMagic;
    std::memcpy(r->addr(), &m, sizeof(m));
  }
  auto open = Arena::Open(MustOpen(p.spec()));
  ASSERT_FALSE(open.ok());
  EXPECT_TRUE(Mentions(open.status(), "interrupted")) << open.status();
  EXPECT_TRUE(Arena::Format(MustOpen(p.spec()), TinyOptions()).ok()) << "no --force needed";
}

// Issue #33: a header page zeroed by accident is not "blank" while the owner table and the
// map behind it are intact: Open and info say so (naming the fix), format refuses it without
// --force, and nothing is changed until --force.
TEST(Arena, ZeroedHeaderPageIsNotBlank) {
  ShmPath p("zeroed");
  std::vector<std::byte> behind;
  std::uint64_t metadata_bytes = 0;
  {
    auto a = MustFormat(p.spec("8M"), TinyOptions());
    metadata_bytes = a->header().metadata_bytes;
  }
  {
    auto r = MustOpen(p.spec());
    behind.assign(r->addr() + kHeaderReservedBytes, r->addr() + metadata_bytes);
    std::memset(r->addr(), 0, kHeaderReservedBytes);
  }
  ArenaHeader h;
  auto r = MustOpen(p.spec());
  const absl::Status st = ValidateHeaderBytes(r->addr(), r->size_bytes(), r->name(), &h);
  EXPECT_FALSE(absl::IsNotFound(st)) << "called blank: " << st;
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_TRUE(Mentions(st, p.path() + ": the header page is zeroed but the region is not blank"))
      << st;
  EXPECT_TRUE(Mentions(st, "Restore it from a backup, or format with --force")) << st;
  auto fmt = Arena::Format(MustOpen(p.spec()), TinyOptions());
  ASSERT_FALSE(fmt.ok()) << "formatted over an arena's metadata without --force";
  EXPECT_TRUE(Mentions(fmt.status(), "without --force")) << fmt.status();
  EXPECT_EQ(std::memcmp(r->addr() + kHeaderReservedBytes, behind.data(), behind.size()), 0)
      << "the metadata behind the header was changed";
  FormatOptions force = TinyOptions();
  force.force = true;
  EXPECT_TRUE(Arena::Format(MustOpen(p.spec()), force).ok());
  // A region blank throughout is still blank.
  auto blank = MustOpen("memfd:?size=8M");
  EXPECT_TRUE(
      absl::IsNotFound(ValidateHeaderBytes(blank->addr(), blank->size_bytes(), blank->name(), &h)));
}

// The corrupt-arena messages (a checksum mismatch, foreign data, a truncated file) each state
// the fix: restore, or --force to discard.
TEST(Arena, CorruptArenaMessagesStateTheFix) {
  ShmPath p("fixes");
  { ASSERT_NE(MustFormat(p.spec("8M"), TinyOptions()), nullptr); }
  {
    auto r = MustOpen(p.spec());
    r->addr()[100] ^= std::byte{0x10};
  }
  auto crc = Arena::Open(MustOpen(p.spec()));
  ASSERT_FALSE(crc.ok());
  EXPECT_TRUE(Mentions(crc.status(), "checksum")) << crc.status();
  EXPECT_TRUE(Mentions(crc.status(), "restore it from a backup, or format with --force"))
      << crc.status();
  ShmPath q("foreign-fix");
  {
    auto r = MustOpen(q.spec("8M"));
    std::memcpy(r->addr(), "SQLite format 3", 16);
  }
  auto foreign = Arena::Open(MustOpen(q.spec()));
  ASSERT_FALSE(foreign.ok());
  EXPECT_TRUE(Mentions(foreign.status(), "foreign data")) << foreign.status();
  EXPECT_TRUE(Mentions(foreign.status(),
                       "Check the spec names an arena; restore it from a "
                       "backup, or format with --force"))
      << foreign.status();
  ShmPath t("truncated");
  { ASSERT_NE(MustFormat(t.spec("8M"), TinyOptions()), nullptr); }
  ASSERT_EQ(::truncate(t.path().c_str(), 4 << 20), 0);
  auto cut = Arena::Open(MustOpen(t.spec()));
  ASSERT_FALSE(cut.ok());
  EXPECT_TRUE(Mentions(cut.status(),
                       "was truncated: restore it from a backup, or format with "
                       "--force"))
      << cut.status();
}

// Read-only opens never create, extend or truncate a file, whatever size= says.
TEST(Region, OpenExistingCreatesNothing) {
  ShmPath p("existing");
  auto none = OpenExistingRegion(*ParseSourceSpec(p.spec("4M")));
  ASSERT_FALSE(none.ok());
  EXPECT_TRUE(absl::IsNotFound(none.status())) << none.status();
  EXPECT_TRUE(Mentions(none.status(), "never creates one")) << none.status();
  struct stat st {};
  EXPECT_NE(::stat(p.path().c_str(), &st), 0) << "created";
  { std::ofstream(p.path()) << ""; }
  EXPECT_FALSE(OpenExistingRegion(*ParseSourceSpec(p.spec("4M"))).ok());
  ASSERT_EQ(::stat(p.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0) << "extended";
  ASSERT_EQ(::truncate(p.path().c_str(), 8 << 20), 0);
  EXPECT_TRUE(
      Mentions(OpenExistingRegion(*ParseSourceSpec(p.spec("4M"))).status(), "never resizes it"));
  auto ok = OpenExistingRegion(*ParseSourceSpec(p.spec("8M")));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->size_bytes(), 8u << 20);
}

// An arena file truncated to 0 bytes (a `> file`, a copy that failed): opening it says the
// file is empty and was truncated if it held a region, instead of advising ?size=, which would
// make a new, empty region of it and hide that the arena is gone (issue #40).
TEST(Region, ATruncatedFileIsNamedAsSuch) {
  ShmPath p("emptied");
  ASSERT_NE(MustFormat(p.spec("16M"), TinyOptions()), nullptr);
  ASSERT_EQ(::truncate(p.path().c_str(), 0), 0);
  auto r = OpenRegion(p.spec());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  EXPECT_TRUE(Mentions(r.status(), "is empty (0 bytes)")) << r.status();
  EXPECT_TRUE(Mentions(r.status(), "truncated")) << r.status();
  EXPECT_TRUE(Mentions(r.status(), "restore it from a backup")) << r.status();
  EXPECT_FALSE(Mentions(r.status(), "add ?size=BYTES to the spec")) << r.status();
  struct stat st {};
  ASSERT_EQ(::stat(p.path().c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0) << "the open changed the file";
}

// A file OpenRegion creates is removed again when the open fails (here: reserving it runs
// into RLIMIT_FSIZE, as ENOSPC would): the next command meets what was there before.
TEST(Region, AFailedCreateLeavesNoFile) {
  ShmPath p("nospace");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{1 << 20, 1 << 20};
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(10);
    auto r = OpenRegion(p.spec("8M"));
    if (r.ok()) ::_exit(1);
    struct stat st {};
    ::_exit(::stat(p.path().c_str(), &st) == 0 ? 2 : 0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: the open succeeded; 2: it left the file behind";
}

TEST(Arena, CorruptHeaderAndMapAreRefusedAndLeftAlone) {
  ShmPath p("corrupt");
  std::uint64_t map_offset = 0;
  {
    auto a = MustFormat(p.spec("8M"), TinyOptions());
    map_offset = a->header().map_offset;
  }
  {
    auto r = MustOpen(p.spec());
    r->addr()[100] ^= std::byte{0x10};  // inside the sealed header
  }
  auto bad = Arena::Open(MustOpen(p.spec()));
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(absl::IsDataLoss(bad.status()));
  EXPECT_TRUE(Mentions(bad.status(), "checksum")) << bad.status();
  {
    auto r = MustOpen(p.spec());
    EXPECT_EQ(r->addr()[100] ^ std::byte{0x10}, r->addr()[100] ^ std::byte{0x10});
    r->addr()[100] ^= std::byte{0x10};  // repair the header, break a map word instead
    std::uint64_t w = PackWord(kAllocated, 99, 5, 0);  // owner 99 > 16 slots
    std::memcpy(r->addr() + map_offset + 8 * 3, &w, 8);
  }
  auto badmap = Arena::Open(MustOpen(p.spec()));
  ASSERT_FALSE(badmap.ok());
  EXPECT_TRUE(absl::IsDataLoss(badmap.status()));
  EXPECT_TRUE(Mentions(badmap.status(), "block 3")) << badmap.status();
}

TEST(Arena, VersionAndLayoutMismatch) {
  ShmPath p("version");
  { ASSERT_NE(MustFormat(p.spec("8M"), TinyOptions()), nullptr); }
  auto other = Arena::Open(MustOpen(p.spec()), OpenOptions{Llama3_70B()});
  ASSERT_FALSE(other.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(other.status()));
  EXPECT_TRUE(Mentions(other.status(), "L=1,H=1,D=64")) << other.status();
  {
    auto r = MustOpen(p.spec());
    ArenaHeader h;
    std::memcpy(&h, r->addr(), sizeof(h));
    coherence::Seal(h, kArenaMagic, kArenaVersion + 1, 1);
    std::memcpy(r->addr(), &h, sizeof(h));
  }
  auto future = Arena::Open(MustOpen(p.spec()));
  ASSERT_FALSE(future.ok());
  EXPECT_TRUE(absl::IsUnimplemented(future.status())) << future.status();
}

TEST(Arena, TooSmallOrBadOptions) {
  FormatOptions o;  // 5 MiB blocks in 4 MiB
  auto small = Arena::Format(MustOpen("memfd:?size=4M"), o);
  ASSERT_FALSE(small.ok());
  EXPECT_TRUE(Mentions(small.status(), "too small")) << small.status();

  FormatOptions bad = TinyOptions();
  bad.owner_slots = 0;
  EXPECT_FALSE(Arena::Format(MustOpen("memfd:?size=4M"), bad).ok());
  bad = TinyOptions();
  bad.classes.assign(9, ClassSpec{16, 0, 1});
  EXPECT_FALSE(Arena::Format(MustOpen("memfd:?size=4M"), bad).ok());
  bad = TinyOptions();
  bad.classes = {{0, 100, 1}};  // not a multiple of 64
  EXPECT_FALSE(Arena::Format(MustOpen("memfd:?size=4M"), bad).ok());
}

TEST(Arena, RegionSizeChangeIsRefused) {
  ShmPath p("resize");
  { ASSERT_NE(MustFormat(p.spec("8M"), TinyOptions()), nullptr); }
  ASSERT_EQ(::truncate(p.path().c_str(), 4 << 20), 0);
  auto a = Arena::Open(MustOpen(p.spec()));
  ASSERT_FALSE(a.ok());
  EXPECT_TRUE(Mentions(a.status(), "original size")) << a.status();
}

TEST(Arena, ReadOnlyOpenResolvesWithoutWriting) {
  ShmPath p("readonly");
  Uuid uuid;
  std::uint32_t index = 0, gen = 0;
  {
    auto a = MustFormat(p.spec("4M"), TinyOptions());
    std::uint32_t got[1];
    ASSERT_EQ(a->ClaimBatch(0, got, 1), 1u);
    index = got[0];
    // Allocate and persist by hand, as the allocator would.
    std::uint64_t w = a->word(index).load();
    a->word(index).store(PackWord(kAllocated, a->owner_id(), WordGen(w), 0));
    gen = WordGen(w);
    ASSERT_TRUE(a->Persist(index, gen));
    std::memcpy(a->BlockAddr(index), "shared", 7);
    uuid = a->uuid();
  }
  auto before = MustOpen(p.spec());
  std::vector<std::byte> image(before->addr(), before->addr() + before->size_bytes());
  OpenOptions ro;
  ro.read_only = true;
  auto a = Arena::Open(MustOpen(p.spec()), ro);
  ASSERT_TRUE(a.ok()) << a.status();
  auto addr = (*a)->Resolve(uuid, index, gen);
  ASSERT_TRUE(addr.ok()) << addr.status();
  EXPECT_STREQ(reinterpret_cast<const char*>(*addr), "shared");
  EXPECT_FALSE((*a)->Resolve(uuid, index, gen + 1).ok());
  Uuid other = uuid;
  other[0] ^= 1;
  EXPECT_FALSE((*a)->Resolve(other, index, gen).ok());
  EXPECT_FALSE((*a)->Resolve(uuid, (*a)->total_blocks(), gen).ok());
  std::uint32_t got[1];
  EXPECT_EQ((*a)->ClaimBatch(0, got, 1), 0u);
  EXPECT_FALSE((*a)->Persist(index, gen));
  a->reset();
  EXPECT_EQ(std::memcmp(image.data(), before->addr(), image.size()), 0)
      << "a read-only open wrote to the region";
}

TEST(Arena, ClaimReleaseAndRecoverHints) {
  auto a = MustFormat("memfd:?size=4M", TinyOptions());
  ASSERT_NE(a, nullptr);
  const std::uint32_t total = a->class_record(0).block_count;
  std::vector<std::uint32_t> got(total + 10);
  ASSERT_EQ(a->ClaimBatch(0, got.data(), got.size()), total);
  EXPECT_EQ(a->ClaimBatch(0, got.data(), 1), 0u);
  std::set<std::uint32_t> unique(got.begin(), got.begin() + total);
  EXPECT_EQ(unique.size(), total);
  a->ReleaseCached(got.data(), total);
  EXPECT_EQ(a->Usage().classes[0].free, total);
  // Lose every hint bit, as a crash between fetch_and and CAS would: Recover repairs them.
  auto* hints =
      reinterpret_cast<std::uint64_t*>(a->region().addr() + a->class_record(0).hint_offset);
  std::memset(hints, 0, (total + 63) / 64 * 8);
  EXPECT_EQ(a->ClaimBatch(0, got.data(), 1), 0u);
  EXPECT_EQ(a->Recover().hints_repaired, total);
  EXPECT_EQ(a->ClaimBatch(0, got.data(), total), total);
}

TEST(Arena, ClaimRunIsContiguousAlignedAndAllOrNothing) {
  auto a = MustFormat("memfd:?size=4M", TinyOptions());
  ASSERT_NE(a, nullptr);
  const std::uint32_t total = a->class_record(0).block_count;
  const std::uint64_t stride = a->class_record(0).stride_bytes;
  // Take every third block with ClaimBatch-style single claims, then ask for runs.
  std::uint32_t one = 0;
  ASSERT_EQ(a->ClaimBatch(0, &one, 1), 1u);
  const std::int64_t r = a->ClaimRun(0, 8, 0);
  ASSERT_GE(r, 0);
  for (std::uint32_t i = 0; i < 8; ++i) {
    const std::uint64_t w = a->word(static_cast<std::uint32_t>(r) + i).load();
    EXPECT_EQ(WordState(w), kCached);
    EXPECT_EQ(WordOwner(w), a->owner_id());
    EXPECT_EQ(a->BlockAddr(static_cast<std::uint32_t>(r) + i),
              a->BlockAddr(static_cast<std::uint32_t>(r)) + i * stride);
  }
  EXPECT_NE(static_cast<std::uint32_t>(r), one);
  // Alignment: the first block's address is a multiple of 64 KiB.
  const std::int64_t al = a->ClaimRun(0, 2, 64 << 10);
  ASSERT_GE(al, 0);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a->BlockAddr(static_cast<std::uint32_t>(al))) %
                (64 << 10),
            0u);
  // A run longer than the arena, or than any free stretch, fails and claims nothing. Where
  // the aligned run lands depends on the mapping's address (it can follow the first run
  // directly, leaving the free blocks one stretch), so a hole is made inside the first run:
  // the free blocks are then never one stretch, wherever the mapping is.
  EXPECT_EQ(a->ClaimRun(0, total + 1, 0), -1);
  const std::uint32_t hole = static_cast<std::uint32_t>(r) + 3;
  a->ReleaseCached(&hole, 1);
  const std::uint32_t free_before = a->Usage().classes[0].free;
  ASSERT_EQ(free_before, total - 10);
  EXPECT_EQ(a->ClaimRun(0, free_before, 0), -1);  // the free blocks are not one stretch
  EXPECT_EQ(a->Usage().classes[0].free, free_before);
  // Released runs are whole again: the arena ends up fully claimable as one run.
  std::vector<std::uint32_t> back;
  for (std::uint32_t i = 0; i < 8; ++i) {
    if (static_cast<std::uint32_t>(r) + i != hole)
      back.push_back(static_cast<std::uint32_t>(r) + i);
  }
  back.push_back(static_cast<std::uint32_t>(al));
  back.push_back(static_cast<std::uint32_t>(al) + 1);
  back.push_back(one);
  a->ReleaseCached(back.data(), back.size());
  EXPECT_EQ(a->Usage().classes[0].free, total);
  EXPECT_EQ(a->ClaimRun(0, total, 0), 0);
  EXPECT_EQ(a->ClaimBatch(0, &one, 1), 0u);
}

// ---- map words on a pool shared without coherence (audit #9, #16) --------------------------

// Records the cache operations an arena applies through its CacheOps seam, in order, and
// performs them. `fetch`, when set, plays memory for one map word: on a real non-coherent
// pool, the mapping of another host may hold a stale copy of a word, and Invalidate is what
// drops it so the next load sees memory. The test stands the stale copy in the mapping and
// lets the recorded Invalidate put memory's value back.
struct CacheLog {
  std::vector<std::tuple<char, std::uintptr_t, std::size_t>> ops;  // 'F'lush, fence 'S', 'I'nv
  BlockWord* fetch_word = nullptr;
  std::uint64_t memory_value = 0;
};
CacheLog* cache_log = nullptr;
void LogFlush(const void* addr, std::size_t len) noexcept {
  cache_log->ops.emplace_back('F', reinterpret_cast<std::uintptr_t>(addr), len);
  coherence::Flush(addr, len);
}
void LogFence() noexcept {
  cache_log->ops.emplace_back('S', 0, 0);
  coherence::Fence();
}
void LogInvalidate(const void* addr, std::size_t len) noexcept {
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  cache_log->ops.emplace_back('I', a, len);
  coherence::Invalidate(addr, len);
  const auto w = reinterpret_cast<std::uintptr_t>(cache_log->fetch_word);
  if (cache_log->fetch_word != nullptr && a <= w && w + sizeof(BlockWord) <= a + len) {
    cache_log->fetch_word->store(cache_log->memory_value);
  }
}
OpenOptions Logged() {
  OpenOptions o;
  o.cache_ops = CacheOps{&LogFlush, &LogFence, &LogInvalidate};
  return o;
}
// Whether the log flushes the line holding `word` and then fences.
bool FlushedThenFenced(const CacheLog& log, const BlockWord* word) {
  const auto w = reinterpret_cast<std::uintptr_t>(word);
  bool flushed = false;
  for (const auto& [op, addr, len] : log.ops) {
    if (op == 'F' && addr <= w && w + sizeof(BlockWord) <= addr + len) flushed = true;
    if (op == 'S' && flushed) return true;
  }
  return false;
}

// Audit #9. A persisted block survives its process; on CXL it must also survive the death of
// the host whose cache holds the word (the device keeps memory). Persist flushes the word and
// fences before it returns — before the publication that names the block is announced — and a
// shared free does the same (lost, it would leave the block persisted for good). The
// allocation fast path flushes nothing.
TEST(Arena, PersistAndSharedFreeFlushTheirMapWord) {
  ShmPath p("persist-flush");
  { ASSERT_NE(MustFormat(p.spec("4M"), TinyOptions()), nullptr); }
  CacheLog log;
  cache_log = &log;
  auto a = Arena::Open(MustOpen(p.spec()), Logged());
  ASSERT_TRUE(a.ok()) << a.status();
  std::uint32_t got[8];
  ASSERT_EQ((*a)->ClaimBatch(0, got, 8), 8u);
  (*a)->ReleaseCached(got + 1, 7);
  EXPECT_TRUE(log.ops.empty()) << "the claim/release fast path flushed something";
  const std::uint32_t index = got[0];
  const std::uint64_t w = (*a)->word(index).load();
  const std::uint32_t gen = WordGen(w);
  (*a)->word(index).store(PackWord(kAllocated, (*a)->owner_id(), gen, 0));  // as Alloc does
  ASSERT_TRUE((*a)->Persist(index, gen));
  EXPECT_TRUE(FlushedThenFenced(log, &(*a)->word(index)))
      << "Persist returned with the persisted word possibly only in this host's cache";
  log.ops.clear();
  ASSERT_TRUE((*a)->FreeShared(index, gen));
  EXPECT_TRUE(FlushedThenFenced(log, &(*a)->word(index)))
      << "FreeShared returned with the freed word possibly only in this host's cache";
  a->reset();
  cache_log = nullptr;
}

// Audit #16. Another host resolves a published block through its read-only view of the
// publisher's arena. That view's copy of the map word may predate the publisher's Persist;
// Resolve must read the word from memory (invalidate, then load), not trust the copy.
TEST(Arena, PeerResolveReadsTheMapWordFromMemory) {
  ShmPath p("peer-resolve");
  auto owner = MustFormat(p.spec("4M"), TinyOptions());
  ASSERT_NE(owner, nullptr);
  std::uint32_t index = 0;
  ASSERT_EQ(owner->ClaimBatch(0, &index, 1), 1u);
  const std::uint32_t gen = WordGen(owner->word(index).load());
  const std::uint64_t cached = owner->word(index).load();  // what a peer saw before
  owner->word(index).store(PackWord(kAllocated, owner->owner_id(), gen, 0));
  ASSERT_TRUE(owner->Persist(index, gen));
  std::memcpy(owner->BlockAddr(index), "published", 10);
  CacheLog log;
  cache_log = &log;
  OpenOptions ro = Logged();
  ro.read_only = true;
  auto peer = Arena::Open(MustOpen(p.spec()), ro);
  ASSERT_TRUE(peer.ok()) << peer.status();
  log.fetch_word = &(*peer)->word(index);
  log.memory_value = (*peer)->word(index).load();
  (*peer)->word(index).store(cached);  // the peer's stale copy
  auto addr = (*peer)->Resolve(owner->uuid(), index, gen);
  ASSERT_TRUE(addr.ok()) << "the peer trusted its stale copy of the map word: " << addr.status();
  EXPECT_STREQ(reinterpret_cast<const char*>(*addr), "published");
  // A stale generation is still refused, from memory's word.
  (*peer)->word(index).store(cached);
  EXPECT_FALSE((*peer)->Resolve(owner->uuid(), index, gen + 1).ok());
  peer->reset();
  cache_log = nullptr;
}

// ---- Giving a window away (audit #4) ---------------------------------------------------------

// The permissions ("rw-s", "r--s", ...) of this process's mapping that holds addr.
std::string MappingPerms(const void* addr) {
  const auto a = reinterpret_cast<std::uintptr_t>(addr);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long lo = 0, hi = 0;
    char perms[8] = {};
    if (std::sscanf(line.c_str(), "%lx-%lx %7s", &lo, &hi, perms) == 3 && lo <= a && a < hi) {
      return perms;
    }
  }
  return "unmapped";
}

// A window (one extent of a pooled source) is memory that changes hands between hosts. When
// this process closes it, every line it dirtied must be written back first: caches are
// physically tagged and unmapping writes nothing back, so a line evicted later would land in
// the next holder's data. Closing the region therefore seals the window (read-only: a late
// store faults instead of slipping in after the write-back), writes back every line of it
// and fences, all before the unmap.
TEST(GiveAway, ClosingAWindowSealsAndWritesItBackBeforeTheUnmap) {
  ShmPath p("giveaway");
  auto whole = MustOpen(p.spec("8M"));
  ASSERT_NE(whole, nullptr);
  auto w = MustOpen(p.spec() + "?offset=2M&length=4M");
  ASSERT_NE(w, nullptr);
  std::byte* const base = w->addr();
  const std::size_t len = w->size_bytes();
  std::memset(base, 0x5A, len);
  cxlkv::testing::CacheTrace trace(len);
  trace.SetProbe([&](coherence::CacheOp op, const void* addr, std::size_t) {
    // Still mapped (the probe runs before the instruction), and how.
    return op == coherence::CacheOp::kFence ? MappingPerms(base) : MappingPerms(addr);
  });
  {
    coherence::ScopedCacheObserver observe(trace);
    w.reset();
    trace.Mark("closed");
  }
  const auto ev = trace.events();
  const int flush =
      cxlkv::testing::CacheTrace::FindFlush(ev, reinterpret_cast<std::uintptr_t>(base), len);
  ASSERT_GE(flush, 0) << "closing the window wrote none of it back\n" << trace.Dump(ev);
  EXPECT_EQ(ev[flush].note.substr(0, 3), "r--") << "stores were not stopped before the write-back\n"
                                                << trace.Dump(ev);
  const int fence = cxlkv::testing::CacheTrace::FenceAfter(ev, flush);
  ASSERT_GE(fence, 0) << "no fence after the write-back\n" << trace.Dump(ev);
  EXPECT_NE(ev[fence].note, "unmapped") << "unmapped before the fence\n" << trace.Dump(ev);
  EXPECT_LT(fence, cxlkv::testing::CacheTrace::FindMark(ev, "closed"));
  EXPECT_EQ(MappingPerms(base), "unmapped");
  EXPECT_EQ(whole->addr()[2 << 20], std::byte{0x5A});
}

// A region of a whole source is not a window: closing it writes nothing back (a multi-GiB
// pool closing at exit would pay for a flush of every line).
TEST(GiveAway, ClosingAWholeSourceWritesNothingBack) {
  ShmPath p("giveaway-whole");
  auto whole = MustOpen(p.spec("4M"));
  ASSERT_NE(whole, nullptr);
  cxlkv::testing::CacheTrace trace(1 << 20);
  {
    coherence::ScopedCacheObserver observe(trace);
    whole.reset();
  }
  for (const auto& e : trace.events()) EXPECT_NE(e.op, coherence::CacheOp::kFlush);
}

}  // namespace
}  // namespace cxlkv::pool
