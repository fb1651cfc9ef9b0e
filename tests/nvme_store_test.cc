// NvmeStore: round trips (aligned and bounced), batched async submission, restart, corruption,
// capacity limit, a real full file system, and kill -9 during writes.
//
// The store lives in a directory under the temporary directory (a disk file system); a test
// whose file system lacks O_DIRECT skips with the store's own message.
#include "cxlkv/nvme/nvme_store.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "nvme_test_util.h"
#include "test_util.h"

namespace cxlkv {
namespace {

using nvme::NvmeBatch;
using nvme::NvmeStore;
using nvme::NvmeStoreOptions;
using testing::AlignedBuffer;
using testing::BlockIsIntact;
using testing::FillBlock;
using testing::KeyOf;

constexpr std::uint64_t kBlock = 64 << 10;

using ReadStaging = NvmeStoreOptions::ReadStaging;

NvmeStoreOptions Options(const std::string& dir, std::uint64_t payload = kBlock,
                         ReadStaging staging = ReadStaging::kAuto) {
  NvmeStoreOptions o;
  o.dir = dir;
  o.payload_bytes = payload;
  o.queue_depth = 32;
  o.grow_bytes = 1 << 20;
  o.read_staging = staging;
  return o;
}

// The read-path tests run twice: reads straight into the caller's buffer, and reads staged
// through the store's 2 MiB-page buffers (what ReadStaging::kAuto picks on a disk that pays
// per page). kAuto's choice depends on the machine, so both are forced here.
class NvmeStoreReads : public ::testing::TestWithParam<ReadStaging> {};
INSTANTIATE_TEST_SUITE_P(Staging, NvmeStoreReads,
                         ::testing::Values(ReadStaging::kNever, ReadStaging::kAlways),
                         [](const ::testing::TestParamInfo<ReadStaging>& p) {
                           return p.param == ReadStaging::kNever ? "Direct" : "Staged";
                         });

// Opens a store, or skips the test when the file system cannot do O_DIRECT.
#define OPEN_OR_SKIP(var, options, report)                                       \
  auto var##_or = NvmeStore::Open(options, report);                              \
  if (absl::IsFailedPrecondition(var##_or.status()) &&                           \
      var##_or.status().message().find("O_DIRECT") != std::string::npos) {       \
    GTEST_SKIP() << var##_or.status();                                           \
  }                                                                              \
  ASSERT_TRUE(var##_or.ok()) << var##_or.status();                               \
  std::unique_ptr<NvmeStore> var = std::move(*var##_or)

void FlipByte(const std::string& path, std::uint64_t offset) {
  const int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  unsigned char b = 0;
  ASSERT_EQ(::pread(fd, &b, 1, static_cast<off_t>(offset)), 1);
  b ^= 0x5A;
  ASSERT_EQ(::pwrite(fd, &b, 1, static_cast<off_t>(offset)), 1);
  ::fsync(fd);
  ::close(fd);
}

TEST_P(NvmeStoreReads, RoundTripAlignedAndBounced) {
  testing::TempDir dir("nvme");
  OPEN_OR_SKIP(store, Options(dir.path(), kBlock, GetParam()), nullptr);
  AlignedBuffer in(kBlock), out(kBlock);
  for (std::uint64_t k = 0; k < 3; ++k) {
    FillBlock(in.data(), kBlock, k, 1);
    ASSERT_TRUE(store->Put(KeyOf(k), in.data(), kBlock).ok());
  }
  for (std::uint64_t k = 0; k < 3; ++k) {
    auto n = store->Get(KeyOf(k), out.data(), kBlock);
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_EQ(*n, kBlock);
    std::uint64_t v = 0;
    EXPECT_TRUE(BlockIsIntact(out.data(), kBlock, k, &v));
    EXPECT_EQ(v, 1u);
  }
  // Unaligned source and destination, odd length: through bounce buffers.
  std::vector<unsigned char> odd_in(1000 + 3), odd_out(1000 + 5);
  FillBlock(odd_in.data() + 3, 1000, 7, 2);
  ASSERT_TRUE(store->Put(KeyOf(7), odd_in.data() + 3, 1000).ok());
  auto n = store->Get(KeyOf(7), odd_out.data() + 5, 1000);
  ASSERT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(*n, 1000u);
  std::uint64_t v = 0;
  EXPECT_TRUE(BlockIsIntact(odd_out.data() + 5, 1000, 7, &v));

  // Overwrite: the newest version reads back; the old slot is retired, not leaked.
  FillBlock(in.data(), kBlock, 1, 9);
  ASSERT_TRUE(store->Put(KeyOf(1), in.data(), kBlock).ok());
  ASSERT_TRUE(store->Get(KeyOf(1), out.data(), kBlock).ok());
  EXPECT_TRUE(BlockIsIntact(out.data(), kBlock, 1, &v));
  EXPECT_EQ(v, 9u);
  store->Drain();
  auto s = store->Stats();
  EXPECT_EQ(s.blocks, 4u);
  EXPECT_EQ(s.tombstones, 1u);
  EXPECT_EQ(s.slots_in_file - s.slots_free, 4u);
  if (GetParam() == ReadStaging::kAlways) {
    EXPECT_EQ(s.staged_gets, 5u);  // every get so far, the odd-sized one too
    EXPECT_EQ(s.staging_bytes, 2u << 20) << "one get at a time: one 2 MiB staging buffer";
  } else {
    EXPECT_EQ(s.staged_gets, 0u);
    EXPECT_EQ(s.staging_bytes, 0u);
  }

  // Errors: missing key, small destination, oversized block, delete.
  EXPECT_TRUE(absl::IsNotFound(store->Get(KeyOf(99), out.data(), kBlock).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store->Get(KeyOf(0), out.data(), kBlock - 1).status()));
  std::vector<unsigned char> big(kBlock + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(store->Put(KeyOf(5), big.data(), big.size())));
  ASSERT_TRUE(store->Delete(KeyOf(0)).ok());
  EXPECT_TRUE(absl::IsNotFound(store->Get(KeyOf(0), out.data(), kBlock).status()));
  EXPECT_TRUE(absl::IsNotFound(store->Delete(KeyOf(0))));
}

TEST_P(NvmeStoreReads, BatchIsOneSubmitAndCompletesOnce) {
  testing::TempDir dir("nvme");
  OPEN_OR_SKIP(store, Options(dir.path(), kBlock, GetParam()), nullptr);
  constexpr int kN = 16;
  std::vector<std::unique_ptr<AlignedBuffer>> bufs;
  NvmeBatch puts;
  for (int i = 0; i < kN; ++i) {
    bufs.push_back(std::make_unique<AlignedBuffer>(kBlock));
    FillBlock(bufs.back()->data(), kBlock, i, 3);
    puts.AddPut(KeyOf(i), bufs.back()->data(), kBlock);
  }
  const auto before = store->Stats().submit_calls;
  int callbacks = 0;
  ASSERT_TRUE(store->Submit(puts, [&](NvmeBatch& b) {
                ++callbacks;
                EXPECT_TRUE(b.first_error().ok()) << b.first_error();
              }).ok());
  EXPECT_EQ(store->Stats().submit_calls - before, 1u) << "16 puts must go in one submit";
  store->Wait(puts);
  EXPECT_EQ(callbacks, 1);
  ASSERT_TRUE(puts.first_error().ok());

  // Prefetch into fresh buffers, completion observed by polling.
  std::vector<std::unique_ptr<AlignedBuffer>> outs;
  std::vector<nvme::NvmeKey> keys;
  std::vector<void*> dests;
  for (int i = 0; i < kN; ++i) {
    outs.push_back(std::make_unique<AlignedBuffer>(kBlock));
    keys.push_back(KeyOf(i));
    dests.push_back(outs.back()->data());
  }
  NvmeBatch gets;
  const auto before_gets = store->Stats().submit_calls;
  std::atomic<int> got_callback{0};
  ASSERT_TRUE(store->Prefetch(keys, dests, kBlock, gets, [&](NvmeBatch&) { ++got_callback; }).ok());
  EXPECT_EQ(store->Stats().submit_calls - before_gets, 1u);
  while (!gets.done()) store->Poll();
  EXPECT_EQ(got_callback.load(), 1);
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(gets.status(i).ok()) << gets.status(i);
    std::uint64_t v = 0;
    EXPECT_TRUE(BlockIsIntact(outs[i]->data(), kBlock, i, &v)) << i;
  }
  // A batch in flight cannot be submitted again.
  NvmeBatch again;
  again.AddGet(KeyOf(0), outs[0]->data(), kBlock);
  ASSERT_TRUE(store->Submit(again).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(store->Submit(again)) || again.done());
  store->Wait(again);
}

TEST_P(NvmeStoreReads, BatchLargerThanQueueDepth) {
  testing::TempDir dir("nvme");
  auto o = Options(dir.path(), 16 << 10, GetParam());
  o.queue_depth = 4;
  OPEN_OR_SKIP(store, o, nullptr);
  constexpr int kN = 37;
  std::vector<unsigned char> data(kN * (16 << 10) + 1);
  NvmeBatch b;
  for (int i = 0; i < kN; ++i) {
    unsigned char* p = data.data() + 1 + i * (16 << 10);  // unaligned: bounced
    FillBlock(p, 16 << 10, i, 1);
    b.AddPut(KeyOf(i), p, 16 << 10);
  }
  ASSERT_TRUE(store->Submit(b).ok());
  store->Wait(b);
  ASSERT_TRUE(b.first_error().ok()) << b.first_error();
  EXPECT_GE(store->Stats().submit_calls, static_cast<std::uint64_t>(kN / 4));
  std::vector<unsigned char> out(16 << 10);
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(store->Get(KeyOf(i), out.data(), out.size()).ok());
    std::uint64_t v = 0;
    EXPECT_TRUE(BlockIsIntact(out.data(), out.size(), i, &v)) << i;
  }
}

// Several threads share one ring: each submits, waits and reaps for the others (queue depth 4,
// so submitters also wait for room). Every thread's blocks read back right.
TEST_P(NvmeStoreReads, ThreadsShareOneRing) {
  testing::TempDir dir("nvme");
  auto o = Options(dir.path(), 8 << 10, GetParam());
  o.queue_depth = 4;
  OPEN_OR_SKIP(store, o, nullptr);
  std::atomic<int> bad{0};
  auto work = [&](std::uint64_t t) {
    std::vector<unsigned char> in(8 << 10), out(8 << 10);
    for (std::uint64_t i = 0; i < 150; ++i) {
      const std::uint64_t k = t * 1000 + i % 20;
      FillBlock(in.data(), in.size(), k, i);
      NvmeBatch b;
      b.AddPut(KeyOf(k), in.data(), in.size());
      b.AddGet(KeyOf(t * 1000 + (i + 7) % 20), out.data(), out.size());
      if (!store->Submit(b).ok()) ++bad;
      if (i % 2 == 0) {
        store->Wait(b);
      } else {
        while (!b.done()) store->Poll();
      }
      if (!b.status(0).ok()) ++bad;
      std::uint64_t v = 0;
      if (b.status(1).ok() && !BlockIsIntact(out.data(), out.size(), t * 1000 + (i + 7) % 20, &v)) {
        ++bad;
      }
    }
  };
  std::vector<std::thread> threads;
  for (std::uint64_t t = 0; t < 3; ++t) threads.emplace_back(work, t);
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
  store->Drain();
  EXPECT_EQ(store->Stats().blocks, 60u);
  EXPECT_EQ(store->Stats().in_flight, 0u);
}

TEST(NvmeStore, RestartRebuildsIndexFromSlotHeaders) {
  testing::TempDir dir("nvme");
  AlignedBuffer in(kBlock), out(kBlock);
  {
    OPEN_OR_SKIP(store, Options(dir.path()), nullptr);
    for (std::uint64_t k = 0; k < 10; ++k) {
      FillBlock(in.data(), kBlock, k, 1);
      ASSERT_TRUE(store->Put(KeyOf(k), in.data(), kBlock).ok());
    }
    for (std::uint64_t k : {2, 5}) {
      FillBlock(in.data(), kBlock, k, 2);
      ASSERT_TRUE(store->Put(KeyOf(k), in.data(), kBlock).ok());
    }
    ASSERT_TRUE(store->Delete(KeyOf(7)).ok());
    // A second process (here: a second open) is refused while this one holds the store.
    auto second = NvmeStore::Open(Options(dir.path()));
    EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  }
  // Reopening with another block size is refused and names the right one.
  auto wrong = NvmeStore::Open(Options(dir.path(), 2 * kBlock));
  ASSERT_TRUE(absl::IsInvalidArgument(wrong.status())) << wrong.status();
  EXPECT_NE(wrong.status().message().find("payload_bytes=65536"), std::string::npos);

  nvme::NvmeOpenReport report;
  OPEN_OR_SKIP(store, Options(dir.path()), &report);
  EXPECT_EQ(report.blocks_indexed, 9u);
  EXPECT_EQ(report.corrupt, 0u);
  EXPECT_EQ(store->Stats().blocks, 9u);
  for (std::uint64_t k = 0; k < 10; ++k) {
    auto n = store->Get(KeyOf(k), out.data(), kBlock);
    if (k == 7) {
      EXPECT_TRUE(absl::IsNotFound(n.status())) << "deleted key came back";
      continue;
    }
    ASSERT_TRUE(n.ok()) << k << ": " << n.status();
    std::uint64_t v = 0;
    ASSERT_TRUE(BlockIsIntact(out.data(), kBlock, k, &v));
    EXPECT_EQ(v, (k == 2 || k == 5) ? 2u : 1u) << k;
  }
  // New writes continue the sequence: an overwrite after restart wins over the old version.
  FillBlock(in.data(), kBlock, 2, 3);
  ASSERT_TRUE(store->Put(KeyOf(2), in.data(), kBlock).ok());
  store.reset();
  OPEN_OR_SKIP(again, Options(dir.path()), nullptr);
  ASSERT_TRUE(again->Get(KeyOf(2), out.data(), kBlock).ok());
  std::uint64_t v = 0;
  ASSERT_TRUE(BlockIsIntact(out.data(), kBlock, 2, &v));
  EXPECT_EQ(v, 3u);
}

TEST_P(NvmeStoreReads, CorruptPayloadIsReportedAndDropped) {
  testing::TempDir dir("nvme");
  AlignedBuffer in(kBlock), out(kBlock);
  NvmeStore::Location where;
  {
    OPEN_OR_SKIP(store, Options(dir.path(), kBlock, GetParam()), nullptr);
    for (std::uint64_t k = 0; k < 3; ++k) {
      FillBlock(in.data(), kBlock, k, 1);
      ASSERT_TRUE(store->Put(KeyOf(k), in.data(), kBlock).ok());
    }
    auto loc = store->Locate(KeyOf(1));
    ASSERT_TRUE(loc.ok());
    where = *loc;
  }
  FlipByte(where.file, where.offset + nvme::kNvmeHeaderBytes + 1234);
  {
    OPEN_OR_SKIP(store, Options(dir.path(), kBlock, GetParam()), nullptr);
    auto n = store->Get(KeyOf(1), out.data(), kBlock);
    ASSERT_TRUE(absl::IsDataLoss(n.status())) << n.status();
    const std::string msg(n.status().message());
    EXPECT_NE(msg.find(where.file), std::string::npos) << msg;
    EXPECT_NE(msg.find("offset " + std::to_string(where.offset)), std::string::npos) << msg;
    EXPECT_NE(msg.find(coherence::FormatKey(KeyOf(1))), std::string::npos) << msg;
    EXPECT_EQ(out.data()[1234], 0) << "a corrupt block's bytes must not be left in the buffer";
    EXPECT_FALSE(store->Contains(KeyOf(1)));
    EXPECT_TRUE(absl::IsNotFound(store->Get(KeyOf(1), out.data(), kBlock).status()));
    EXPECT_EQ(store->Stats().data_loss, 1u);
    for (std::uint64_t k : {0, 2}) {
      ASSERT_TRUE(store->Get(KeyOf(k), out.data(), kBlock).ok());
      std::uint64_t v = 0;
      EXPECT_TRUE(BlockIsIntact(out.data(), kBlock, k, &v));
    }
  }
  // The dropped block stays dropped after a restart (its slot was retired).
  OPEN_OR_SKIP(store, Options(dir.path(), kBlock, GetParam()), nullptr);
  EXPECT_FALSE(store->Contains(KeyOf(1)));
  EXPECT_EQ(store->Stats().blocks, 2u);
}

// Damage behind an open store's back. A Get reads the payload alone and checks it against the
// XXH3 the index holds (what this store wrote there), so: a slot rewritten with another slot's
// header and payload is found by the Get — kDataLoss naming file, offset and key, the block
// dropped, its bytes cleared from the buffer; a damaged header over an intact payload returns
// the right bytes (the data is what was written), and the next Open drops the block.
TEST_P(NvmeStoreReads, DamageBehindTheStoresBackNeverReturnsWrongData) {
  testing::TempDir dir("nvme");
  AlignedBuffer in(kBlock), out(kBlock);
  {
    OPEN_OR_SKIP(store, Options(dir.path(), kBlock, GetParam()), nullptr);
    for (std::uint64_t k = 0; k < 3; ++k) {
      FillBlock(in.data(), kBlock, k, 1);
      ASSERT_TRUE(store->Put(KeyOf(k), in.data(), kBlock).ok());
    }
    auto zero = store->Locate(KeyOf(0));
    auto one = store->Locate(KeyOf(1));
    auto two = store->Locate(KeyOf(2));
    ASSERT_TRUE(zero.ok() && one.ok() && two.ok());
    FlipByte(one->file, one->offset + 40);  // inside the CRC-covered header
    {
      // Slot 2 gets slot 0's whole slot: a valid header and payload of another key.
      const int fd = ::open(zero->file.c_str(), O_RDWR);
      ASSERT_GE(fd, 0);
      std::vector<char> slot(nvme::kNvmeHeaderBytes + kBlock);
      ASSERT_EQ(::pread(fd, slot.data(), slot.size(), static_cast<off_t>(zero->offset)),
                static_cast<ssize_t>(slot.size()));
      ASSERT_EQ(::pwrite(fd, slot.data(), slot.size(), static_cast<off_t>(two->offset)),
                static_cast<ssize_t>(slot.size()));
      ::fsync(fd);
      ::close(fd);
    }
    std::memset(out.data(), 0x5A, kBlock);
    auto n = store->Get(KeyOf(2), out.data(), kBlock);
    ASSERT_TRUE(absl::IsDataLoss(n.status())) << n.status();
    const std::string msg(n.status().message());
    EXPECT_NE(msg.find("overwritten behind the store's back"), std::string::npos) << msg;
    EXPECT_NE(msg.find(two->file), std::string::npos) << msg;
    EXPECT_NE(msg.find("offset " + std::to_string(two->offset)), std::string::npos) << msg;
    EXPECT_NE(msg.find(coherence::FormatKey(KeyOf(2))), std::string::npos) << msg;
    EXPECT_EQ(out.data()[1234], 0) << "another key's bytes must not be left in the buffer";
    EXPECT_FALSE(store->Contains(KeyOf(2)));
    EXPECT_EQ(store->Stats().data_loss, 1u);
    std::uint64_t v = 0;
    ASSERT_TRUE(store->Get(KeyOf(1), out.data(), kBlock).ok()) << "its payload is intact";
    EXPECT_TRUE(BlockIsIntact(out.data(), kBlock, 1, &v));
    ASSERT_TRUE(store->Get(KeyOf(0), out.data(), kBlock).ok());
    EXPECT_TRUE(BlockIsIntact(out.data(), kBlock, 0, &v));
  }
  // The next Open checks every header: key 1's damaged one is dropped, key 2 stays dropped.
  OPEN_OR_SKIP(store, Options(dir.path(), kBlock, GetParam()), nullptr);
  EXPECT_TRUE(store->Contains(KeyOf(0)));
  EXPECT_FALSE(store->Contains(KeyOf(1)));
  EXPECT_FALSE(store->Contains(KeyOf(2)));
}

// kAuto times reads into 4 KiB pages and into the staging buffer at Open, reports both and
// stages only where that is >= 10 % faster. The probe file does not outlive the Open.
TEST(NvmeStoreStaging, AutoMeasuresBothAndReportsWhatItChose) {
  testing::TempDir dir("nvme");
  nvme::NvmeOpenReport report;
  OPEN_OR_SKIP(store, Options(dir.path(), 192 << 10), &report);
  ASSERT_TRUE(report.read_probe_error.empty()) << report.read_probe_error;
  EXPECT_EQ(report.read_probe_bytes, 192u << 10);
  EXPECT_GT(report.read_probe_direct_us, 0);
  EXPECT_GT(report.read_probe_staged_us, 0);
  EXPECT_EQ(report.reads_staged,
            report.read_probe_staged_us * 10 < report.read_probe_direct_us * 9);
  EXPECT_EQ(store->stages_reads(), report.reads_staged);
  std::cout << "read probe, 192 KiB: direct " << report.read_probe_direct_us << " us, staged "
            << report.read_probe_staged_us << " us -> "
            << (report.reads_staged ? "staged" : "direct") << "\n";
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) {
    EXPECT_EQ(e.path().filename().string().find("probe"), std::string::npos) << e.path();
  }
  // Forced choices measure nothing.
  store.reset();
  nvme::NvmeOpenReport forced;
  OPEN_OR_SKIP(again, Options(dir.path(), 192 << 10, ReadStaging::kNever), &forced);
  EXPECT_EQ(forced.read_probe_bytes, 0u);
  EXPECT_FALSE(forced.reads_staged);
  EXPECT_FALSE(again->stages_reads());
}

// Staging memory stays within staging_bytes: a batch of 16 gets in flight at once has one
// 2 MiB buffer to share, so one get is staged and fifteen read directly, all correct. With a
// budget of zero nothing is staged; a destination added as direct is never staged.
TEST(NvmeStoreStaging, BudgetAndDirectDestinations) {
  testing::TempDir dir("nvme");
  auto o = Options(dir.path(), kBlock, ReadStaging::kAlways);
  o.staging_bytes = 2 << 20;
  constexpr int kN = 16;
  std::vector<std::unique_ptr<AlignedBuffer>> bufs;
  {
    OPEN_OR_SKIP(store, o, nullptr);
    EXPECT_TRUE(store->stages_reads());
    for (int i = 0; i < kN; ++i) {
      bufs.push_back(std::make_unique<AlignedBuffer>(kBlock));
      FillBlock(bufs.back()->data(), kBlock, i, 4);
      ASSERT_TRUE(store->Put(KeyOf(i), bufs.back()->data(), kBlock).ok());
    }
    NvmeBatch gets;
    for (int i = 0; i < kN; ++i) {
      std::memset(bufs[i]->data(), 0, kBlock);
      gets.AddGet(KeyOf(i), bufs[i]->data(), kBlock);
    }
    ASSERT_TRUE(store->Submit(gets).ok());
    store->Wait(gets);
    for (int i = 0; i < kN; ++i) {
      ASSERT_TRUE(gets.status(i).ok()) << gets.status(i);
      std::uint64_t v = 0;
      EXPECT_TRUE(BlockIsIntact(bufs[i]->data(), kBlock, i, &v)) << i;
    }
    auto s = store->Stats();
    EXPECT_EQ(s.staged_gets, 1u);
    EXPECT_EQ(s.staging_bytes, 2u << 20);

    store->AddDirectDestination(bufs[3]->data(), kBlock);
    ASSERT_TRUE(store->Get(KeyOf(3), bufs[3]->data(), kBlock).ok());
    EXPECT_EQ(store->Stats().staged_gets, 1u) << "a direct destination was staged";
    ASSERT_TRUE(store->Get(KeyOf(4), bufs[4]->data(), kBlock).ok());
    EXPECT_EQ(store->Stats().staged_gets, 2u);
  }
  o.staging_bytes = 0;
  OPEN_OR_SKIP(store, o, nullptr);
  ASSERT_TRUE(store->Get(KeyOf(5), bufs[5]->data(), kBlock).ok());
  std::uint64_t v = 0;
  EXPECT_TRUE(BlockIsIntact(bufs[5]->data(), kBlock, 5, &v));
  EXPECT_EQ(store->Stats().staged_gets, 0u);
  EXPECT_EQ(store->Stats().staging_bytes, 0u);
}

TEST(NvmeStore, CorruptHeaderIsReportedAtOpen) {
  testing::TempDir dir("nvme");
  AlignedBuffer in(kBlock), out(kBlock);
  NvmeStore::Location where;
  {
    OPEN_OR_SKIP(store, Options(dir.path()), nullptr);
    for (std::uint64_t k = 0; k < 3; ++k) {
      FillBlock(in.data(), kBlock, k, 1);
      ASSERT_TRUE(store->Put(KeyOf(k), in.data(), kBlock).ok());
    }
    where = *store->Locate(KeyOf(2));
  }
  FlipByte(where.file, where.offset + 50);  // inside the key field
  nvme::NvmeOpenReport report;
  OPEN_OR_SKIP(store, Options(dir.path()), &report);
  EXPECT_EQ(report.corrupt, 1u);
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_NE(report.problems[0].find("offset " + std::to_string(where.offset)), std::string::npos)
      << report.problems[0];
  EXPECT_FALSE(store->Contains(KeyOf(2)));
  for (std::uint64_t k : {0, 1}) {
    ASSERT_TRUE(store->Get(KeyOf(k), out.data(), kBlock).ok());
    std::uint64_t v = 0;
    EXPECT_TRUE(BlockIsIntact(out.data(), kBlock, k, &v));
  }
}

TEST(NvmeStore, CapacityLimitRefusesWritesAndKeepsBlocks) {
  testing::TempDir dir("nvme");
  auto o = Options(dir.path());
  o.capacity_bytes = 4 * (kBlock + nvme::kNvmeHeaderBytes);
  OPEN_OR_SKIP(store, o, nullptr);
  AlignedBuffer in(kBlock), out(kBlock);
  for (std::uint64_t k = 0; k < 4; ++k) {
    FillBlock(in.data(), kBlock, k, 1);
    ASSERT_TRUE(store->Put(KeyOf(k), in.data(), kBlock).ok());
  }
  FillBlock(in.data(), kBlock, 4, 1);
  absl::Status st = store->Put(KeyOf(4), in.data(), kBlock);
  ASSERT_TRUE(absl::IsResourceExhausted(st)) << st;
  EXPECT_NE(st.message().find("capacity_bytes"), std::string::npos) << st;
  // Replacing a block needs a free slot too (never written in place): refused, old intact.
  FillBlock(in.data(), kBlock, 0, 2);
  EXPECT_TRUE(absl::IsResourceExhausted(store->Put(KeyOf(0), in.data(), kBlock)));
  for (std::uint64_t k = 0; k < 4; ++k) {
    ASSERT_TRUE(store->Get(KeyOf(k), out.data(), kBlock).ok());
    std::uint64_t v = 0;
    ASSERT_TRUE(BlockIsIntact(out.data(), kBlock, k, &v));
    EXPECT_EQ(v, 1u);
  }
  ASSERT_TRUE(store->Delete(KeyOf(3)).ok());
  store->Drain();  // the retired slot is free once its tombstone is written
  FillBlock(in.data(), kBlock, 4, 1);
  EXPECT_TRUE(store->Put(KeyOf(4), in.data(), kBlock).ok());
  EXPECT_EQ(store->Stats().out_of_space, 2u);
}

// A real full file system: a 1 MiB tmpfs. With preallocation the fallocate that grows the file
// fails; without it the write itself does. Either way: kResourceExhausted, blocks intact.
void FillSmallFs(bool preallocate) {
  std::string why;
  auto fs = testing::SmallFs::Mount(1 << 20, &why);
  if (fs == nullptr) GTEST_SKIP() << why;
  auto o = Options(fs->path() + "/store", 128 << 10);
  o.grow_bytes = 0;  // one slot at a time
  o.preallocate = preallocate;
  OPEN_OR_SKIP(store, o, nullptr);
  AlignedBuffer in(128 << 10), out(128 << 10);
  std::uint64_t stored = 0;
  absl::Status st;
  for (std::uint64_t k = 0; k < 32; ++k) {
    FillBlock(in.data(), in.size(), k, 1);
    st = store->Put(KeyOf(k), in.data(), in.size());
    if (!st.ok()) break;
    ++stored;
  }
  ASSERT_TRUE(absl::IsResourceExhausted(st)) << st;
  EXPECT_NE(st.message().find("No space left on device"), std::string::npos) << st;
  EXPECT_GE(stored, 3u);
  EXPECT_LT(stored, 8u);
  for (std::uint64_t k = 0; k < stored; ++k) {
    ASSERT_TRUE(store->Get(KeyOf(k), out.data(), out.size()).ok()) << k;
    std::uint64_t v = 0;
    EXPECT_TRUE(BlockIsIntact(out.data(), out.size(), k, &v)) << k;
  }
  // Still full, still consistent after a restart.
  store.reset();
  OPEN_OR_SKIP(again, o, nullptr);
  EXPECT_EQ(again->Stats().blocks, stored);
}

TEST(NvmeStore, FullFileSystemWithPreallocation) { FillSmallFs(true); }
TEST(NvmeStore, FullFileSystemWithoutPreallocation) { FillSmallFs(false); }

// ---- kill -9 during writes ------------------------------------------------------------------

constexpr std::uint64_t kCrashKeys = 24;
constexpr std::uint64_t kCrashBlock = 16 << 10;

// What the writer told the checker, in memory shared across fork().
struct CrashLedger {
  std::atomic<std::uint64_t> submitted[kCrashKeys];  // highest version ever submitted
  std::atomic<std::uint64_t> acked[kCrashKeys];      // highest version whose put completed OK
  std::atomic<std::uint64_t> deleted[kCrashKeys];    // 1: a delete was issued after that ack
  std::atomic<std::uint64_t> batches;                // batches the writer saw complete
};

NvmeStoreOptions CrashOptions(const std::string& dir) {
  auto o = Options(dir, kCrashBlock);
  o.capacity_bytes = 40 * (kCrashBlock + nvme::kNvmeHeaderBytes);  // tight: puts fail often
  o.grow_bytes = 4 * (kCrashBlock + nvme::kNvmeHeaderBytes);
  return o;
}

[[noreturn]] void CrashWriter(const std::string& dir, CrashLedger* ledger, std::uint64_t seed) {
  auto store = NvmeStore::Open(CrashOptions(dir));
  if (!store.ok()) ::_exit(3);
  std::mt19937_64 rng(seed);
  std::vector<std::unique_ptr<AlignedBuffer>> bufs;
  for (int i = 0; i < 8; ++i) bufs.push_back(std::make_unique<AlignedBuffer>(kCrashBlock));
  for (;;) {
    NvmeBatch b;
    std::vector<std::uint64_t> keys, versions;
    const int n = 1 + static_cast<int>(rng() % 6);
    for (int i = 0; i < n; ++i) {
      const std::uint64_t k = rng() % kCrashKeys;
      if (std::find(keys.begin(), keys.end(), k) != keys.end()) continue;
      if (rng() % 8 == 0) {
        ledger->deleted[k].store(1);
        b.AddDelete(KeyOf(k));
        keys.push_back(k);
        versions.push_back(0);
        continue;
      }
      const std::uint64_t v = ledger->submitted[k].load() + 1;
      ledger->submitted[k].store(v);
      FillBlock(bufs[keys.size()]->data(), kCrashBlock, k, v);
      b.AddPut(KeyOf(k), bufs[keys.size()]->data(), kCrashBlock);
      keys.push_back(k);
      versions.push_back(v);
    }
    if ((*store)->Submit(b).ok()) (*store)->Wait(b);
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (versions[i] != 0 && b.status(i).ok()) {
        ledger->acked[keys[i]].store(versions[i]);
        ledger->deleted[keys[i]].store(0);
      }
    }
    ledger->batches.fetch_add(1);
  }
}

int CrashIterations() {
  const char* s = std::getenv("CXLKV_NVME_CRASH_ITERATIONS");
  return s != nullptr ? std::atoi(s) : 25;
}

TEST(NvmeStoreCrash, KillDuringWritesNeverYieldsAWrongBlock) {
  const std::uint64_t seed = testing::TestSeed();
  std::cout << "seed " << seed << " (replay: CXLKV_SEED=" << seed << ")\n";
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  testing::TempDir dir("nvme-crash");
  {
    OPEN_OR_SKIP(probe, CrashOptions(dir.path()), nullptr);
  }
  void* mem = ::mmap(nullptr, sizeof(CrashLedger), PROT_READ | PROT_WRITE,
                     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* ledger = new (mem) CrashLedger{};
  std::mt19937_64 rng(seed);
  AlignedBuffer out(kCrashBlock);
  std::uint64_t present = 0, lost_reported = 0;
  for (int it = 0; it < CrashIterations(); ++it) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    // The kill lands after the writer has made progress, not after a time: a slow machine
    // (a sanitizer build, a loaded CI host) that opens the store in 30 ms must still be
    // killed mid-writes, never before its first put (the test would then prove nothing).
    // The writer is killed once it has completed 1-8 batches since this fork, then after a
    // random 0-3 ms more, so the kill falls anywhere inside the next batches.
    const std::uint64_t before = ledger->batches.load();
    const std::uint64_t wanted = before + 1 + rng() % 8;
    const auto waited_from = std::chrono::steady_clock::now();
    if (pid == 0) CrashWriter(dir.path(), ledger, rng());
    while (ledger->batches.load() < wanted) {
      int wstatus = 0;
      ASSERT_EQ(::waitpid(pid, &wstatus, WNOHANG), 0)
          << "the writer ended before it was killed (iteration " << it << ", status " << wstatus
          << ")";
      if (std::chrono::steady_clock::now() - waited_from > std::chrono::seconds(120)) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
        FAIL() << "the writer completed " << ledger->batches.load() - before << " of "
               << wanted - before << " batches in 120 s (iteration " << it << ")";
      }
      ::usleep(100);
    }
    ::usleep(static_cast<useconds_t>(rng() % 3000));
    ::kill(pid, SIGKILL);
    int wstatus = 0;
    ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(wstatus)) << "writer exited early with status "
                                      << WEXITSTATUS(wstatus) << " (iteration " << it << ")";
    nvme::NvmeOpenReport report;
    auto store = NvmeStore::Open(CrashOptions(dir.path()), &report);
    ASSERT_TRUE(store.ok()) << store.status();
    for (std::uint64_t k = 0; k < kCrashKeys; ++k) {
      const std::uint64_t acked = ledger->acked[k].load();
      const bool deleted = ledger->deleted[k].load() != 0;
      auto n = (*store)->Get(KeyOf(k), out.data(), kCrashBlock);
      if (absl::IsNotFound(n.status())) {
        // Missing is allowed by the crash rule; after kill -9 (no power loss) a completed
        // put that was not deleted afterwards must still be there.
        EXPECT_TRUE(acked == 0 || deleted)
            << "iteration " << it << ": key " << k << " acked v" << acked << " is missing";
        continue;
      }
      if (absl::IsDataLoss(n.status())) {
        ++lost_reported;  // reported, never returned: allowed
        continue;
      }
      ASSERT_TRUE(n.ok()) << n.status();
      ++present;
      std::uint64_t v = 0;
      ASSERT_TRUE(BlockIsIntact(out.data(), kCrashBlock, k, &v))
          << "iteration " << it << ": key " << k << " read back wrong bytes";
      EXPECT_LE(v, ledger->submitted[k].load()) << "key " << k;
      if (!deleted) {
        EXPECT_GE(v, acked) << "iteration " << it << ": key " << k << " rolled back";
      }
    }
    if (::testing::Test::HasFailure()) break;
  }
  std::cout << "blocks checked present: " << present << ", reported lost: " << lost_reported
            << "\n";
  EXPECT_GT(present, 0u) << "the writer never completed a put: the test proves nothing";
  ::munmap(mem, sizeof(CrashLedger));
}

}  // namespace
}  // namespace cxlkv
