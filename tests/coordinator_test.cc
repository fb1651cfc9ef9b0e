// LMCache's memory coordinator (orchestrator/lmcache/): its logic on an injected clock, and
// its state file across a restart. No HTTP here (tests/lmcache/coordinator_http_test.py).
#include "cxlkv/orchestrator/lmcache/coordinator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "cxlkv/orchestrator/lmcache/config.h"
#include "cxlkv/orchestrator/lmcache/service.h"
#include "eventually.h"
#include "test_util.h"

namespace cxlkv::coordinator {
namespace {

constexpr std::uint64_t kAlign = 4096;
constexpr std::uint64_t kRegion = 64 * kAlign;
constexpr std::uint64_t kOffset = 1ull << 30;  // the region's place in the pool

class CoordinatorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // tmpfs: the state file is synced on every change, which the logic tests need not wait for.
    dir_ = std::filesystem::path("/dev/shm") /
           absl::StrCat("cxlkv-coordinator-test-", ::getpid(), "-", counter_++);
    std::filesystem::create_directories(dir_);
    c_.listen = "127.0.0.1:0";
    c_.token_file = "/nonexistent";
    c_.region_id = "r0";
    c_.layout_id = "L1";
    c_.region_bytes = kRegion;
    c_.alignment_bytes = kAlign;
    c_.reservation_ttl_ms = 1000;
    c_.read_lease_ms = 500;
    c_.state_file = (dir_ / "lmcache.state").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Coordinator> Open(std::int64_t now = 0) {
    auto co = Coordinator::Open(c_, kOffset, now);
    EXPECT_TRUE(co.ok()) << co.status();
    return co.ok() ? *std::move(co) : nullptr;
  }
  static ObjectKey Key(int i) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016x", i);
    return ObjectKey{hex, "m", 0, 0, ""};
  }
  // An object of `blocks` alignment units (float16 elements).
  static ReserveItem Item(int i, std::uint64_t blocks = 1) {
    return ReserveItem{Key(i),
                       Layout{{{static_cast<std::int64_t>(blocks * kAlign / 2)}}, {"float16"}}};
  }
  // Reserves and finishes; returns the handle.
  Handle Put(Coordinator& co, const std::string& tenant, int i, std::int64_t now,
             std::uint64_t blocks = 1) {
    const std::string e = co.region().region_epoch;
    auto g = co.Reserve(tenant, e, {Item(i, blocks)}, now);
    EXPECT_TRUE(g.ok()) << g.status();
    if (!g.ok() || !(*g)[0]) return {};
    EXPECT_TRUE(co.Finish(tenant, e, {{(*g)[0]->key, (*g)[0]->token}}, now).ok());
    return (*g)[0]->handle;
  }
  bool Present(Coordinator& co, const std::string& tenant, int i, std::int64_t now) {
    auto h = co.Lookup(tenant, co.region().region_epoch, {Key(i)}, now);
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() && (*h)[0].has_value();
  }

  static inline int counter_ = 0;
  std::filesystem::path dir_;
  CoordinatorConfig c_;
};

TEST_F(CoordinatorTest, ReserveFinishLookup) {
  auto co = Open();
  const std::string e = co->region().region_epoch;
  EXPECT_EQ(e.size(), 32u);
  auto g = co->Reserve("t", e, {Item(1), Item(2, 2)}, 0);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE((*g)[0] && (*g)[1]);
  const Handle h1 = (*g)[0]->handle, h2 = (*g)[1]->handle;
  EXPECT_EQ(h1.offset % kAlign, 0u);
  EXPECT_LT(h1.offset, kRegion);  // region-relative (the pool offset is kOffset + offset)
  EXPECT_EQ(co->region().region_offset, kOffset);
  EXPECT_EQ(h1.length, kAlign);
  EXPECT_EQ(h2.length, 2 * kAlign);
  EXPECT_GT(h2.generation, h1.generation);
  EXPECT_TRUE(h1.offset + h1.length <= h2.offset || h2.offset + h2.length <= h1.offset);
  // WRITING is not visible; a second reserve of the key is a null grant.
  EXPECT_FALSE(Present(*co, "t", 1, 0));
  auto again = co->Reserve("t", e, {Item(1)}, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE((*again)[0]);
  ASSERT_TRUE(
      co->Finish("t", e, {{(*g)[0]->key, (*g)[0]->token}, {(*g)[1]->key, (*g)[1]->token}}, 1).ok());
  auto hits = co->Lookup("t", e, {Key(1), Key(2), Key(3)}, 2);
  ASSERT_TRUE(hits.ok());
  ASSERT_TRUE((*hits)[0] && (*hits)[1]);
  EXPECT_FALSE((*hits)[2]);
  EXPECT_EQ((*hits)[0]->handle.generation, h1.generation);
  EXPECT_EQ((*hits)[1]->handle.offset, h2.offset);
  EXPECT_EQ(co->stats().used_bytes, 3 * kAlign);
  EXPECT_EQ(co->stats().object_count, 2u);
}

// The real state file behind a disk that takes its time: every Sync first waits for `gate`
// (when set) and then `delay_ms`, and counts itself; the rest is FileStateStore's. With
// `first_sync_waits_for` set, the first Sync also waits until that many records were appended
// (progress, not time: on a busy machine the writers may otherwise run one after another).
class SlowDisk : public StateStore {
 public:
  SlowDisk(const std::string& path, int delay_ms, absl::Notification* gate = nullptr)
      : file_(FileStateStore(path)), delay_ms_(delay_ms), gate_(gate) {}
  absl::StatusOr<std::optional<Loaded>> Load() override { return file_->Load(); }
  absl::Status Append(std::uint64_t seq, const std::string& record) override {
    ++appends;
    return file_->Append(seq, record);
  }
  absl::Status Sync() override {
    if (gate_ != nullptr) gate_->WaitForNotification();
    if (syncs.load() == 0 && first_sync_waits_for > 0) {
      // Bounded, so a coordinator that serialises its writers fails the test instead of
      // hanging it.
      EXPECT_TRUE(testing::Eventually([&] { return appends.load() >= first_sync_waits_for; },
                                      std::chrono::milliseconds(60000)))
          << appends.load() << " records appended while the first sync waited";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    ++syncs;
    return failing ? absl::InternalError("injected: the disk is gone") : file_->Sync();
  }
  absl::Status Compact(const std::string& text, std::uint64_t seq) override {
    return file_->Compact(text, seq);
  }
  std::string where() const override { return file_->where(); }
  std::string journal_where() const override { return file_->journal_where(); }
  std::atomic<int> syncs{0};
  std::atomic<int> appends{0};
  std::atomic<bool> failing{false};
  int first_sync_waits_for = 0;

 private:
  std::unique_ptr<StateStore> file_;
  int delay_ms_;
  absl::Notification* gate_;
};

// Group commit: 8 threads reserving and finishing at once share syncs (a slow disk: 10 ms a
// sync; the first one held until every thread appended its first record, so the sharing does
// not hang on the scheduler), every acknowledged object is there after a restart, and a failed
// sync fails the call and every one after it.
TEST_F(CoordinatorTest, ConcurrentChangesShareSyncsAndSurviveARestart) {
  constexpr int kThreads = 8, kEach = 4;
  auto disk = std::make_unique<SlowDisk>(c_.state_file, 10);
  SlowDisk* d = disk.get();
  d->first_sync_waits_for = kThreads;
  auto opened = Coordinator::Open(c_, kOffset, 0, std::move(disk));
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::unique_ptr<Coordinator> co = *std::move(opened);
  std::vector<std::thread> ts;
  std::atomic<int> acked{0};
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        if (Put(*co, "t", t * 100 + i, 0).length != 0) ++acked;
      }
    });
  }
  for (auto& t : ts) t.join();
  ASSERT_EQ(acked.load(), kThreads * kEach);
  const Stats s = co->stats();
  EXPECT_EQ(s.journal_records, 2u * kThreads * kEach);  // a reserve and a finish each
  // One at a time, each record would need its own sync (64); sharing needs fewer (about 30
  // on a quiet machine: a sync covers what was appended before it started). The 7 records
  // appended while the first sync was held share the next one at least.
  std::printf("%d records, %d syncs\n", static_cast<int>(s.journal_records), d->syncs.load());
  EXPECT_LE(d->syncs.load(), static_cast<int>(s.journal_records) - (kThreads - 2))
      << "no group commit";
  EXPECT_EQ(static_cast<int>(s.syncs), d->syncs.load());
  d->failing = true;
  const std::string e = co->region().region_epoch;
  auto refused = co->Reserve("t", e, {Item(999)}, 0);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInternal) << refused.status();
  EXPECT_NE(refused.status().message().find("restart"), std::string::npos);
  EXPECT_FALSE(co->Lookup("t", e, {Key(0)}, 0).ok()) << "nothing is acknowledged after it";
  co.reset();
  auto back = Open();
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kEach; ++i) EXPECT_TRUE(Present(*back, "t", t * 100 + i, 1)) << t << i;
  }
}

// A lookup does not reveal a finish whose record is not durable yet: it waits for the sync.
TEST_F(CoordinatorTest, ALookupWaitsForTheFinishItReveals) {
  auto writer = Open();
  const std::string e = writer->region().region_epoch;
  auto g = writer->Reserve("t", e, {Item(7)}, 0);
  ASSERT_TRUE(g.ok() && (*g)[0]);
  writer.reset();
  absl::Notification gate;
  auto opened =
      Coordinator::Open(c_, kOffset, 0, std::make_unique<SlowDisk>(c_.state_file, 0, &gate));
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::unique_ptr<Coordinator> co = *std::move(opened);
  std::atomic<bool> finished{false}, looked{false};
  std::thread fin([&] {
    EXPECT_TRUE(co->Finish("t", e, {{(*g)[0]->key, (*g)[0]->token}}, 0).ok());
    finished = true;
  });
  // The finish is applied and waits in Sync; a lookup now sees it only once it is durable.
  while (co->stats().finished == 0) std::this_thread::yield();
  std::thread look([&] {
    auto h = co->Lookup("t", e, {Key(7)}, 0);
    EXPECT_TRUE(h.ok() && (*h)[0]);
    looked = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(finished.load());
  EXPECT_FALSE(looked.load()) << "a lookup revealed a finish that was not durable";
  gate.Notify();
  fin.join();
  look.join();
  EXPECT_TRUE(finished.load() && looked.load());
}

TEST_F(CoordinatorTest, ErrorsChangeNothing) {
  auto co = Open();
  const std::string e = co->region().region_epoch;
  EXPECT_EQ(co->Reserve("t", "other", {Item(1)}, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(co->Reserve("t", e, {Item(1), Item(1)}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  ReserveItem bad = Item(1);
  bad.layout.dtypes = {"float17"};
  EXPECT_EQ(co->Reserve("t", e, {bad}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  bad = Item(1);
  bad.layout.shapes = {{0}};
  EXPECT_EQ(co->Reserve("t", e, {bad}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  bad = Item(1);
  bad.key.chunk_hash_hex = "ABCD";
  EXPECT_EQ(co->Reserve("t", e, {bad}, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(co->stats().used_bytes, 0u);
  auto g = co->Reserve("t", e, {Item(1), Item(2)}, 0);
  ASSERT_TRUE(g.ok());
  const ReservationRef r1{(*g)[0]->key, (*g)[0]->token}, r2{(*g)[1]->key, (*g)[1]->token};
  // A wrong token, a duplicate, another tenant, a stale epoch: all refused, nothing finished.
  EXPECT_EQ(co->Finish("t", e, {r1, {r2.key, "nope"}}, 0).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(co->Finish("t", e, {r1, r1}, 0).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(co->Finish("u", e, {r1}, 0).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(co->Finish("t", "x", {r1}, 0).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(Present(*co, "t", 1, 0));
  EXPECT_EQ(co->Lookup("t", e, {Key(1), Key(1)}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(co->Finish("t", e, {r1}, 0).ok());
  // Finished: neither finish nor abort owns it any more.
  EXPECT_EQ(co->Finish("t", e, {r1}, 0).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(co->Abort("t", e, {r1}, 0).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(Present(*co, "t", 1, 0));
}

TEST_F(CoordinatorTest, AbortAndExpiryGiveSpaceBack) {
  auto co = Open();
  const std::string e = co->region().region_epoch;
  auto g = co->Reserve("t", e, {Item(1, 8), Item(2, 8)}, 0);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(co->stats().used_bytes, 16 * kAlign);
  ASSERT_TRUE(co->Abort("t", e, {{(*g)[0]->key, (*g)[0]->token}}, 10).ok());
  EXPECT_EQ(co->stats().used_bytes, 8 * kAlign);
  // The aborted key is free to reserve again, in the space just given back.
  auto g3 = co->Reserve("t", e, {Item(1, 8)}, 20);
  ASSERT_TRUE(g3.ok() && (*g3)[0]);
  EXPECT_EQ((*g3)[0]->handle.offset, (*g)[0]->handle.offset);
  EXPECT_GT((*g3)[0]->handle.generation, (*g)[1]->handle.generation);
  // Nothing expires before the TTL; both do after it, and their finish is refused.
  ASSERT_EQ(*co->Expire(999), 0u);
  ASSERT_EQ(*co->Expire(1020), 2u);
  EXPECT_EQ(co->stats().used_bytes, 0u);
  EXPECT_EQ(co->stats().expired, 2u);
  EXPECT_EQ(co->Finish("t", e, {{(*g)[1]->key, (*g)[1]->token}}, 1021).code(),
            absl::StatusCode::kAborted);
  // A finish after the TTL but before the reaper ran is refused too.
  auto g4 = co->Reserve("t", e, {Item(4)}, 2000);
  ASSERT_TRUE(g4.ok());
  auto late = co->Finish("t", e, {{(*g4)[0]->key, (*g4)[0]->token}}, 3000);
  EXPECT_EQ(late.code(), absl::StatusCode::kAborted);
  EXPECT_NE(late.message().find("expired"), std::string::npos) << late;
}

TEST_F(CoordinatorTest, OutOfSpaceIsWholeBatch) {
  auto co = Open();
  const std::string e = co->region().region_epoch;
  // Larger than the region: refused without evicting anything.
  Put(*co, "t", 1, 0, 60);
  auto huge = co->Reserve("t", e, {Item(2, 65)}, 10000);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(Present(*co, "t", 1, 10000));
  // A batch that fits only partly while everything is leased: nothing reserved.
  auto part = co->Reserve("t", e, {Item(3, 2), Item(4, 4)}, 10000);
  EXPECT_EQ(part.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(co->stats().used_bytes, 60 * kAlign);
  EXPECT_EQ(co->stats().object_count, 1u);
}

// Keys LMCache's ObjectKey refuses (lmcache/v1/distributed/api.py, ObjectKey.__post_init__;
// docs/lmcache.md "Keys") are refused in its words, on reserve, lookup and finish alike; what
// it accepts at the edges (a 128-character salt, '/' in a model name) is served.
TEST_F(CoordinatorTest, KeysAreCheckedAsLMCacheChecksThem) {
  auto co = Open();
  const std::string e = co->region().region_epoch;
  struct Bad {
    ObjectKey key;
    std::string reason;
  };
  std::vector<Bad> bad;
  auto with = [](auto edit) {
    ObjectKey k = Key(1);
    edit(k);
    return k;
  };
  bad.push_back({with([](ObjectKey& k) { k.model_name = "org/m@v1"; }),
                 "model_name must not contain '@' (got 'org/m@v1')"});
  bad.push_back({with([](ObjectKey& k) { k.object_group_id = -1; }),
                 "object_group_id must be >= 0 (got -1)"});
  for (const std::string& salt : std::vector<std::string>{"a@b", "u/1", "u\\1",
                                                          std::string("u\0"
                                                                      "1",
                                                                      3)}) {
    bad.push_back(
        {with([&](ObjectKey& k) { k.cache_salt = salt; }), "cache_salt must not contain"});
  }
  bad.push_back({with([](ObjectKey& k) { k.cache_salt = std::string(129, 's'); }),
                 "cache_salt exceeds max length 128 (got 129)"});
  for (const Bad& b : bad) {
    const absl::Status st = CheckKey(b.key);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << b.reason;
    EXPECT_NE(st.message().find(b.reason), std::string::npos) << st;
    ReserveItem it = Item(1);
    it.key = b.key;
    EXPECT_EQ(co->Reserve("t", e, {it}, 0).status().code(), absl::StatusCode::kInvalidArgument)
        << b.reason;
    EXPECT_EQ(co->Lookup("t", e, {b.key}, 0).status().code(), absl::StatusCode::kInvalidArgument)
        << b.reason;
    EXPECT_EQ(co->Finish("t", e, {{b.key, "t"}}, 0).code(), absl::StatusCode::kInvalidArgument)
        << b.reason;
  }
  EXPECT_EQ(co->stats().used_bytes, 0u);
  // The edges LMCache accepts: 128 characters (a two-byte character counts once), '/' in the
  // model name (HuggingFace ids), a salt with other punctuation.
  std::string salt128;
  for (int i = 0; i < 128; ++i) salt128 += "\xc3\xa9";  // U+00E9, 256 bytes
  for (const ObjectKey& k : {with([&](ObjectKey& x) { x.cache_salt = salt128; }),
                             with([](ObjectKey& x) { x.model_name = "meta-llama/Llama-3.1-8B"; }),
                             with([](ObjectKey& x) { x.cache_salt = "user-1:a.b_c"; })}) {
    EXPECT_TRUE(CheckKey(k).ok()) << CheckKey(k);
  }
}

// A layout whose size passes every integer type is one that fits no region: LMCache (Python
// integers) answers 507 out_of_space, and so does the coordinator, not 422; for a key that
// exists already it is a null grant, as any existing key's. A negative dimension stays 422.
TEST_F(CoordinatorTest, ALayoutTooLargeForAnyIntegerIsOutOfSpace) {
  auto co = Open();
  const std::string e = co->region().region_epoch;
  Layout huge{{{std::int64_t{1} << 40, std::int64_t{1} << 40}}, {"float64"}};
  EXPECT_EQ(*LayoutBytes(huge), kLayoutTooLarge);
  auto r = co->Reserve("t", e, {ReserveItem{Key(1), huge}}, 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_NE(r.status().message().find("out_of_space"), std::string::npos) << r.status();
  // Two of them: no wrap-around of the batch's total.
  r = co->Reserve("t", e, {ReserveItem{Key(1), huge}, ReserveItem{Key(2), huge}}, 0);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  Put(*co, "t", 3, 0);
  r = co->Reserve("t", e, {ReserveItem{Key(3), huge}}, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE((*r)[0]);
  Layout negative{{{std::int64_t{1} << 40, std::int64_t{1} << 40, -1}}, {"float64"}};
  EXPECT_EQ(LayoutBytes(negative).status().code(), absl::StatusCode::kInvalidArgument);
  Layout empty{{{std::int64_t{1} << 62, std::int64_t{1} << 62, 0}}, {"uint8"}};
  EXPECT_EQ(*LayoutBytes(empty), 0u);
  EXPECT_EQ(co->stats().used_bytes, kAlign);
}

// LMCache serves a lookup of any size; the coordinator too, past max_batch, its answers in the
// order of the keys.
TEST_F(CoordinatorTest, LookupsLargerThanMaxBatchAreServed) {
  c_.max_batch = 16;
  auto co = Open();
  const std::string e = co->region().region_epoch;
  for (int i : {0, 17, 40}) Put(*co, "t", i, 0);
  std::vector<ObjectKey> keys;
  for (int i = 0; i < 50; ++i) keys.push_back(Key(i));
  auto hits = co->Lookup("t", e, keys, 1);
  ASSERT_TRUE(hits.ok()) << hits.status();
  ASSERT_EQ(hits->size(), 50u);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ((*hits)[static_cast<std::size_t>(i)].has_value(), i == 0 || i == 17 || i == 40) << i;
  }
  // A duplicate in another chunk is still the whole batch's error.
  keys.push_back(Key(3));
  EXPECT_EQ(co->Lookup("t", e, keys, 1).status().code(), absl::StatusCode::kInvalidArgument);
  // And the wire reads it whole.
  std::string body = R"({"region_epoch": "e", "keys": [)";
  for (int i = 0; i < 50; ++i) {
    body += absl::StrCat(i == 0 ? "" : ",", R"({"chunk_hash_hex": ")", Key(i).chunk_hash_hex,
                         R"(", "model_name": "m", "kv_rank": 0})");
  }
  body += "]}";
  auto req = ParseBody("/v1/lookup", body, 16);
  ASSERT_TRUE(req.ok()) << req.status();
  EXPECT_EQ(req->keys.size(), 50u);
}

// LMCache limits no batch's items; by default (max_batch 0) cxlkv neither, beyond the request's
// 64 MiB: 5,000 reserves, finishes, aborts and lookups in one call each, in the coordinator and
// on the wire. A max_batch the operator sets still refuses a larger batch, naming the setting.
TEST_F(CoordinatorTest, BatchesHaveNoLimitByDefault) {
  EXPECT_EQ(CoordinatorConfig{}.max_batch, 0u);
  constexpr int kItems = 5000;
  c_.max_batch = CoordinatorConfig{}.max_batch;
  c_.alignment_bytes = 64;
  c_.region_bytes = 8192 * 64;
  auto co = Open();
  const std::string e = co->region().region_epoch;
  const Layout small{{{32}}, {"float16"}};  // 64 bytes: one alignment unit
  std::vector<ReserveItem> items;
  for (int i = 0; i < kItems; ++i) items.push_back(ReserveItem{Key(i), small});
  auto g = co->Reserve("t", e, items, 0);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->size(), static_cast<std::size_t>(kItems));
  std::vector<ReservationRef> to_finish, to_abort;
  for (int i = 0; i < kItems; ++i) {
    const auto& grant = (*g)[static_cast<std::size_t>(i)];
    ASSERT_TRUE(grant.has_value()) << i;
    (i % 5 == 0 ? to_abort : to_finish).push_back({grant->key, grant->token});
  }
  ASSERT_TRUE(co->Finish("t", e, to_finish, 0).ok());
  ASSERT_TRUE(co->Abort("t", e, to_abort, 0).ok());
  std::vector<ObjectKey> keys;
  for (int i = 0; i < kItems; ++i) keys.push_back(Key(i));
  auto hits = co->Lookup("t", e, keys, 0);
  ASSERT_TRUE(hits.ok()) << hits.status();
  for (int i = 0; i < kItems; ++i) {
    EXPECT_EQ((*hits)[static_cast<std::size_t>(i)].has_value(), i % 5 != 0) << i;
  }
  EXPECT_EQ(co->stats().used_bytes, static_cast<std::uint64_t>(kItems - kItems / 5) * 64);

  std::string reserve = R"({"region_epoch": "e", "items": [)";
  std::string refs = R"({"region_epoch": "e", "reservations": [)";
  for (int i = 0; i < kItems; ++i) {
    const std::string key = absl::StrCat(R"({"chunk_hash_hex": ")", Key(i).chunk_hash_hex,
                                         R"(", "model_name": "m", "kv_rank": 0})");
    absl::StrAppend(&reserve, i == 0 ? "" : ",", R"({"key": )", key,
                    R"(, "layout": {"shapes": [[32]], "dtypes": ["float16"]}})");
    absl::StrAppend(&refs, i == 0 ? "" : ",", R"({"key": )", key, R"(, "token": "t"})");
  }
  reserve += "]}";
  refs += "]}";
  for (const auto& [route, body] :
       {std::pair{"/v1/writes/reserve", reserve}, std::pair{"/v1/writes/finish", refs},
        std::pair{"/v1/writes/abort", refs}}) {
    auto req = ParseBody(route, body, CoordinatorConfig{}.max_batch);
    ASSERT_TRUE(req.ok()) << route << ": " << req.status();
    EXPECT_EQ(req->items.size() + req->refs.size(), static_cast<std::size_t>(kItems)) << route;
    auto limited = ParseBody(route, body, 4096);
    EXPECT_EQ(limited.status().code(), absl::StatusCode::kInvalidArgument) << route;
    EXPECT_NE(limited.status().message().find("more than lmcache.max_batch (4096)"),
              std::string::npos)
        << limited.status();
  }
}

// kv_rank and object_group_id are pydantic `int`s in LMCache's models (lax mode): "0" and 0.0
// are 0; a fraction, a word or an empty string is refused (422).
TEST(CoordinatorWire, KeyIntegersAreReadAsLMCachesModelsReadThem) {
  auto parse = [](const std::string& rank, const std::string& group) {
    return ParseBody("/v1/lookup",
                     absl::StrCat(R"({"region_epoch": "e", "keys": [{"chunk_hash_hex": "ab", )",
                                  R"("model_name": "m", "kv_rank": )", rank,
                                  R"(, "object_group_id": )", group, "}]}"),
                     4096);
  };
  const std::vector<std::pair<std::string, std::int64_t>> good = {
      {"0", 0},
      {R"("0")", 0},
      {"0.0", 0},
      {R"("7")", 7},
      {"7.0", 7},
      {R"("-3")", -3},
      {"9223372036854775807", INT64_MAX}};
  for (const auto& [text, want] : good) {
    auto req = parse(text, text);
    ASSERT_TRUE(req.ok()) << text << ": " << req.status();
    EXPECT_EQ(req->keys[0].kv_rank, want) << text;
    EXPECT_EQ(req->keys[0].object_group_id, want) << text;
  }
  for (const std::string text : {"0.5", R"("x")", R"("")", R"("-")", "1e300", "null", "[]"}) {
    auto req = parse(text, "0");
    EXPECT_EQ(req.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(req.status().message().find("kv_rank"), std::string::npos) << req.status();
  }
  // Layout dimensions stay strict integers (LMCache's StrictInt).
  auto dims = ParseBody("/v1/writes/reserve",
                        R"({"region_epoch": "e", "items": [{"key": {"chunk_hash_hex": "ab", )"
                        R"("model_name": "m", "kv_rank": 0}, "layout": {"shapes": [["4"]], )"
                        R"("dtypes": ["uint8"]}}]})",
                        4096);
  EXPECT_EQ(dims.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, EvictsLeastRecentlyUsedNeverLeased) {
  auto co = Open();
  const std::string e = co->region().region_epoch;
  for (int i = 0; i < 8; ++i) Put(*co, "t", i, 0, 8);  // the region is full
  EXPECT_EQ(co->stats().used_bytes, kRegion);
  // Object 0 is read at 1000 (leased until 1500); 1 is the least recently used unleased one.
  ASSERT_TRUE(Present(*co, "t", 0, 1000));
  auto g = co->Reserve("t", e, {Item(100, 8)}, 1001);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE(Present(*co, "t", 0, 1002));
  EXPECT_FALSE(Present(*co, "t", 1, 1002));
  EXPECT_TRUE(Present(*co, "t", 2, 1002));
  EXPECT_EQ(co->stats().evicted, 1u);
  // Every finished object read just now: nothing may go, the batch is refused.
  for (int i = 2; i < 8; ++i) ASSERT_TRUE(Present(*co, "t", i, 1003));
  EXPECT_EQ(co->Reserve("t", e, {Item(101, 8)}, 1004).status().code(),
            absl::StatusCode::kResourceExhausted);
  // Writing objects are never evicted either: after the leases the writer's 8 blocks (where 1
  // was) stay, and 48 contiguous blocks come from evicting everything else.
  auto g2 = co->Reserve("t", e, {Item(101, 48)}, 1600);
  ASSERT_TRUE(g2.ok()) << g2.status();
  EXPECT_EQ(co->stats().evicted, 8u);
  EXPECT_EQ(co->stats().writing, 2u);
}

// The domain's policy: a [[namespace]] pin level keeps a tenant's objects longer, whatever
// their age.
TEST_F(CoordinatorTest, PinLevelsAreEvictedLast) {
  c_.pins["gold/lmcache/L1"] = 2;
  auto co = Open();
  EXPECT_EQ(co->PinOf("gold"), 2);
  EXPECT_EQ(co->PinOf("bronze"), 0);
  const std::string e = co->region().region_epoch;
  for (int i = 0; i < 4; ++i) Put(*co, "gold", i, 0, 8);  // the oldest objects
  for (int i = 0; i < 4; ++i) Put(*co, "bronze", i, 1, 8);
  for (int i = 0; i < 4; ++i) {
    auto g = co->Reserve("bronze", e, {Item(100 + i, 8)}, 2000);
    ASSERT_TRUE(g.ok()) << g.status();
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(Present(*co, "gold", i, 2001)) << i;
    EXPECT_FALSE(Present(*co, "bronze", i, 2001)) << i;
  }
  // With no bronze left, gold goes, oldest first.
  auto g = co->Reserve("bronze", e, {Item(200, 8)}, 5000);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_FALSE(Present(*co, "gold", 0, 5001));
  EXPECT_TRUE(Present(*co, "gold", 1, 5001));
}

TEST_F(CoordinatorTest, TenantsAreNamespacesWithQuotas) {
  c_.quotas["small"] = 16 * kAlign;
  auto co = Open();
  const std::string e = co->region().region_epoch;
  // One key, two tenants: two objects.
  const Handle a = Put(*co, "big", 1, 0, 8);
  const Handle b = Put(*co, "small", 1, 0, 8);
  EXPECT_NE(a.offset, b.offset);
  EXPECT_NE(co->NamespaceOf("big"), co->NamespaceOf("small"));
  Put(*co, "small", 2, 0, 8);  // small is at its quota
  Put(*co, "big", 2, 0, 8);
  // small writes more: it evicts its own least recently used, never big's.
  auto g = co->Reserve("small", e, {Item(3, 8)}, 5000);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_FALSE(Present(*co, "small", 1, 5001));
  EXPECT_TRUE(Present(*co, "big", 1, 5001));
  EXPECT_TRUE(Present(*co, "big", 2, 5001));
  EXPECT_EQ(co->stats().tenant_used_bytes.at("small"), 16 * kAlign);
  // small's objects all writing or leased: 507, though the region has room.
  EXPECT_TRUE(Present(*co, "small", 2, 5002));
  auto refused = co->Reserve("small", e, {Item(4, 8)}, 5003);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("quota"), std::string::npos);
  // Larger than the quota itself: refused at once.
  EXPECT_EQ(co->Reserve("small", e, {Item(5, 17)}, 9000).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(CoordinatorTest, RestartKeepsObjectsHandlesAndEpoch) {
  std::string epoch;
  Handle h;
  Grant pending;
  {
    auto co = Open();
    epoch = co->region().region_epoch;
    h = Put(*co, "t", 1, 0, 3);
    auto g = co->Reserve("t", epoch, {Item(2)}, 0);
    ASSERT_TRUE(g.ok());
    pending = *(*g)[0];
  }
  auto co = Open(100000);
  EXPECT_TRUE(co->restored());
  EXPECT_EQ(co->region().region_epoch, epoch);
  auto hits = co->Lookup("t", epoch, {Key(1)}, 100000);
  ASSERT_TRUE(hits.ok() && (*hits)[0]);
  EXPECT_EQ((*hits)[0]->handle.offset, h.offset);
  EXPECT_EQ((*hits)[0]->handle.generation, h.generation);
  // The writer that reserved before the restart may still finish (its TTL restarted).
  ASSERT_TRUE(co->Finish("t", epoch, {{pending.key, pending.token}}, 100500).ok());
  // Generations continue past every one handed out before.
  const Handle h3 = Put(*co, "t", 3, 100600);
  EXPECT_GT(h3.generation, pending.handle.generation);
  EXPECT_EQ(co->stats().used_bytes, 5 * kAlign);
  // Only a reset (the state moved away: the contents declared gone) makes a new epoch, and the
  // old epoch is then stale.
  co.reset();
  std::filesystem::rename(c_.state_file, c_.state_file + ".old");
  std::filesystem::rename(c_.state_file + ".journal", c_.state_file + ".journal.old");
  auto fresh = Open(200000);
  EXPECT_FALSE(fresh->restored());
  EXPECT_NE(fresh->region().region_epoch, epoch);
  EXPECT_EQ(fresh->Lookup("t", epoch, {Key(1)}, 200000).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(CoordinatorTest, BadStateFileIsRefusedAndKept) {
  {
    auto co = Open();
    Put(*co, "t", 1, 0);
  }
  std::string text;
  {
    std::ifstream in(c_.state_file);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  // Another region in the configuration: refused, naming the key.
  c_.layout_id = "L2";
  auto other = Coordinator::Open(c_, kOffset, 0);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.status().message().find("layout_id"), std::string::npos) << other.status();
  c_.layout_id = "L1";
  // One byte flipped: data loss, and the file is left as it was.
  std::string bad = text;
  bad[bad.size() / 2] ^= 1;
  { std::ofstream(c_.state_file) << bad; }
  auto torn = Coordinator::Open(c_, kOffset, 0);
  EXPECT_EQ(torn.status().code(), absl::StatusCode::kDataLoss) << torn.status();
  std::ifstream in(c_.state_file);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), bad);
}

// The journal: a crash mid-append leaves a torn last line (dropped: its reply was never sent);
// a damaged record before the end stops the start; a crash after a new snapshot but before the
// journal was emptied replays nothing twice; compaction keeps the state.
TEST_F(CoordinatorTest, JournalReplayTornTailAndCompaction) {
  const std::string journal = c_.state_file + ".journal";
  auto slurp = [](const std::string& f) {
    std::ifstream in(f, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  std::string epoch;
  Handle h1, h2;
  {
    auto co = Open();
    epoch = co->region().region_epoch;
    h1 = Put(*co, "t", 1, 0, 2);
    h2 = Put(*co, "t", 2, 0, 3);
  }
  const std::string old_journal = slurp(journal);
  ASSERT_FALSE(old_journal.empty());
  // A torn record after the good ones: dropped.
  { std::ofstream(journal, std::ios::app) << R"({"seq":99,"puts":[)"; }
  {
    auto co = Open(10);
    EXPECT_EQ(co->region().region_epoch, epoch);
    EXPECT_TRUE(Present(*co, "t", 1, 10));
    EXPECT_TRUE(Present(*co, "t", 2, 10));
    EXPECT_EQ(co->stats().used_bytes, 5 * kAlign);
    // The restart compacted: the journal is empty and the snapshot holds both.
    EXPECT_EQ(slurp(journal), "");
  }
  // The old journal beside the newer snapshot (a crash before it was emptied): same state.
  { std::ofstream(journal, std::ios::binary) << old_journal; }
  {
    auto co = Open(20);
    EXPECT_EQ(co->stats().used_bytes, 5 * kAlign);
    EXPECT_EQ(co->stats().object_count, 2u);
    auto hits = co->Lookup("t", epoch, {Key(1), Key(2)}, 20);
    ASSERT_TRUE(hits.ok() && (*hits)[0] && (*hits)[1]);
    EXPECT_EQ((*hits)[0]->handle.generation, h1.generation);
    EXPECT_EQ((*hits)[1]->handle.offset, h2.offset);
    // Enough changes to fold the journal into a snapshot while serving.
    // 1,200 records (a reserve and a finish each; the region holds 64, so evictions too).
    for (int i = 0; i < 600; ++i) Put(*co, "t", 1000 + i, 30 + i, 1);
    const std::string j = slurp(journal);
    EXPECT_LT(std::count(j.begin(), j.end(), '\n'), 1024) << "the journal was never compacted";
  }
  {
    auto co = Open(100000);
    EXPECT_TRUE(Present(*co, "t", 1599, 100000));
    EXPECT_FALSE(Present(*co, "t", 1000, 100000));  // evicted long ago
    EXPECT_EQ(co->stats().used_bytes, kRegion);
  }
  // A damaged record followed by another: data loss, the files untouched.
  {
    // A restart gives every object a fresh read lease: room only once it has passed.
    auto co = Open(200000);
    EXPECT_EQ(co->Reserve("t", epoch, {Item(3)}, 200000).status().code(),
              absl::StatusCode::kResourceExhausted);
    Put(*co, "t", 3, 200000 + 500);
    Put(*co, "t", 4, 200000 + 500);
  }
  std::string bad = slurp(journal);
  const std::size_t first_nl = bad.find('\n');
  ASSERT_NE(first_nl, std::string::npos);
  bad[first_nl / 2] ^= 1;
  { std::ofstream(journal, std::ios::binary) << bad; }
  auto broken = Coordinator::Open(c_, kOffset, 300000);
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kDataLoss) << broken.status();
  EXPECT_NE(broken.status().message().find(".journal:1"), std::string::npos) << broken.status();
  EXPECT_EQ(slurp(journal), bad);
}

// Random reserve/finish/abort/lookup/expire/restart: live objects never overlap, stay inside
// the region, used_bytes is their sum, and a restart changes none of it.
TEST_F(CoordinatorTest, RandomOperationsKeepInvariants) {
  const std::uint64_t seed = cxlkv::testing::TestSeed();
  SCOPED_TRACE(absl::StrCat("seed ", seed, " (CXLKV_SEED to replay)"));
  std::mt19937_64 rng(seed);
  c_.quotas["q"] = 20 * kAlign;
  auto co = Open();
  const std::string e = co->region().region_epoch;
  std::vector<std::pair<std::string, Grant>> open;
  std::int64_t now = 0;
  const std::string tenants[] = {"p", "q"};
  for (int step = 0; step < 1200; ++step) {
    now += static_cast<std::int64_t>(rng() % 50);
    const std::string& t = tenants[rng() % 2];
    switch (rng() % 6) {
      case 0:
      case 1: {
        std::vector<ReserveItem> items;
        const int n = 1 + static_cast<int>(rng() % 4);
        for (int i = 0; i < n; ++i)
          items.push_back(Item(static_cast<int>(rng() % 200) + 1000 * i, 1 + rng() % 6));
        auto g = co->Reserve(t, e, items, now);
        if (g.ok()) {
          for (auto& x : *g)
            if (x) open.emplace_back(t, *x);
        } else {
          ASSERT_TRUE(g.status().code() == absl::StatusCode::kResourceExhausted ||
                      g.status().code() == absl::StatusCode::kInvalidArgument)
              << g.status();
        }
        break;
      }
      case 2:
      case 3:
        if (!open.empty()) {
          const std::size_t i = rng() % open.size();
          const auto [tt, gr] = open[i];
          open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
          const absl::Status st = rng() % 3 == 0 ? co->Abort(tt, e, {{gr.key, gr.token}}, now)
                                                 : co->Finish(tt, e, {{gr.key, gr.token}}, now);
          ASSERT_TRUE(st.ok() || st.code() == absl::StatusCode::kAborted) << st;
        }
        break;
      case 4:
        ASSERT_TRUE(co->Lookup(t, e, {Key(static_cast<int>(rng() % 200))}, now).ok());
        break;
      default:
        if (rng() % 10 == 0) {
          co.reset();
          co = Open(now);
          ASSERT_EQ(co->region().region_epoch, e);
        } else {
          ASSERT_TRUE(co->Expire(now).ok());
        }
    }
    // Invariants, through lookups of every key a tenant may hold.
    if (step % 100 == 99) {
      std::vector<Handle> live;
      for (const std::string& tt : tenants) {
        std::vector<ObjectKey> keys;
        for (int k = 0; k < 4000; ++k) {
          if (k % 1000 < 200) keys.push_back(Key(k));
        }
        auto hits = co->Lookup(tt, e, keys, now);
        ASSERT_TRUE(hits.ok());
        for (auto& h : *hits)
          if (h) live.push_back(h->handle);
      }
      std::sort(live.begin(), live.end(), [](auto& a, auto& b) { return a.offset < b.offset; });
      for (std::size_t i = 0; i < live.size(); ++i) {
        ASSERT_LE(live[i].offset + live[i].length, kRegion);
        if (i > 0) {
          ASSERT_LE(live[i - 1].offset + live[i - 1].length, live[i].offset);
        }
      }
      const Stats s = co->stats();
      std::uint64_t sum = 0;
      for (const auto& [tt, b] : s.tenant_used_bytes) sum += b;
      ASSERT_EQ(sum, s.used_bytes);
      if (s.tenant_used_bytes.count("q") != 0) {
        ASSERT_LE(s.tenant_used_bytes.at("q"), 20 * kAlign);
      }
    }
  }
}

// ---- the domain's prefix index (docs/lmcache.md "Keys in the domain's index") ----------------

std::optional<coherence::RegionObject> RefOf(const Coordinator::IndexOp& op) {
  return coherence::AsRegionObject(op.ref);
}

// Finished objects are offered to the index under the tenant's namespace and the key's name
// key, with their handle as a region ref; an evicted one's range is held — counted, not
// granted — until the index lets it go, and a reserve that needs it waits for that.
TEST_F(CoordinatorTest, IndexedObjectsAreHeldAfterEvictionUntilTheIndexLetsThemGo) {
  c_.index_wait_ms = 400;
  c_.evict_ahead_bytes = 0;  // exactly what each batch needs (evicting ahead: below)
  auto co = Open();
  co->AttachIndex({});
  const std::string e = co->region().region_epoch;
  std::vector<Handle> h;
  for (int i = 0; i < 8; ++i) h.push_back(Put(*co, "t", i, 0, 8));  // full
  auto ops = co->TakeIndexOps();
  ASSERT_EQ(ops.size(), 8u);
  const coherence::Namespace ns = coherence::MakeNamespace("t", "lmcache", "L1");
  EXPECT_EQ(co->IndexNamespace("t"), ns);
  for (int i = 0; i < 8; ++i) {
    EXPECT_TRUE(ops[i].publish);
    EXPECT_EQ(ops[i].ns, ns);
    EXPECT_EQ(ops[i].key, coherence::NameKey(ns, std::string(Key(i).chunk_hash_hex) + "\x1fm\x1f"
                                                                                      "0\x1f"
                                                                                      "0\x1f"));
    EXPECT_EQ(RefOf(ops[i]), (coherence::RegionObject{h[i].offset, h[i].length, h[i].generation,
                                                      coherence::Crc32c("r0", 2)}));
  }
  EXPECT_EQ(co->stats().indexed, 8u);
  // A reserve that needs object 0's range: 0 is evicted (gone from lookups, its entry retired)
  // but its range is the index's till released: not within index_wait_ms here.
  auto g = co->Reserve("t", e, {Item(100, 8)}, 1);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kResourceExhausted) << g.status();
  EXPECT_NE(g.status().message().find("lmcache.index_wait_ms"), std::string::npos) << g.status();
  EXPECT_FALSE(Present(*co, "t", 0, 2));
  EXPECT_EQ(co->stats().evicted, 1u);
  EXPECT_EQ(co->stats().held_bytes, 8 * kAlign);
  EXPECT_EQ(co->stats().used_bytes, kRegion) << "a held range is still taken";
  ops = co->TakeIndexOps();
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_FALSE(ops[0].publish);
  EXPECT_EQ(ops[0].key, coherence::NameKey(ns, IndexName(Key(0))));
  // Retrying before the release evicts nothing more: the held range is on its way.
  EXPECT_FALSE(co->Reserve("t", e, {Item(100, 8)}, 3).ok());
  EXPECT_EQ(co->stats().evicted, 1u);
  // A release of another generation at that offset frees nothing.
  auto stale =
      coherence::RegionRef({h[0].offset, h[0].length, h[0].generation + 100, co->RegionTag()});
  co->IndexReleased({*stale});
  EXPECT_EQ(co->stats().held_bytes, 8 * kAlign);
  // The release comes while a reserve waits: it is granted object 0's range.
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    co->IndexReleased(
        {*coherence::RegionRef({h[0].offset, h[0].length, h[0].generation, co->RegionTag()})});
  });
  auto g2 = co->Reserve("t", e, {Item(100, 8)}, 4);
  releaser.join();
  ASSERT_TRUE(g2.ok()) << g2.status();
  ASSERT_TRUE((*g2)[0]);
  EXPECT_EQ((*g2)[0]->handle.offset, h[0].offset);
  EXPECT_GT((*g2)[0]->handle.generation, h[7].generation);
  EXPECT_EQ(co->stats().held_bytes, 0u);
  EXPECT_EQ(co->stats().evicted, 1u);
  EXPECT_GE(co->stats().index_waits, 2u);
}

// Once the region is full, a reserve evicts ahead: evict_ahead bytes beyond its batch are
// free or on their way back from the index, so the next reserves find space without waiting
// for the index's grace.
TEST_F(CoordinatorTest, AFullRegionEvictsAheadSoTheNextReservesNeedNotWait) {
  c_.index_wait_ms = 0;  // a reserve that would wait fails at once: no wait goes unseen
  c_.evict_ahead_bytes = 3 * 8 * kAlign;
  auto co = Open();
  co->AttachIndex({});
  const std::string e = co->region().region_epoch;
  // The index, played here: refs by key from the publishes; a retire is reclaimed when told.
  std::map<std::pair<std::uint64_t, std::uint64_t>, coherence::BlockRef> refs;
  std::vector<coherence::BlockRef> retired;
  auto play_index = [&] {
    for (const auto& op : co->TakeIndexOps()) {
      if (op.publish) {
        refs[{op.key.lo, op.key.hi}] = op.ref;
      } else {
        retired.push_back(refs.at({op.key.lo, op.key.hi}));
      }
    }
  };
  // The index keeps up (each retire reclaimed before the next reserve): none waits, and from
  // the moment the region fills, 24 blocks stay free or on their way back after every reserve.
  for (int i = 0; i < 20; ++i) {
    auto g = co->Reserve("t", e, {Item(i, 8)}, i);
    ASSERT_TRUE(g.ok()) << i << ": " << g.status();
    ASSERT_TRUE(co->Finish("t", e, {{(*g)[0]->key, (*g)[0]->token}}, i).ok());
    const Stats st = co->stats();
    if (i >= 5) {
      EXPECT_GE(kRegion - st.used_bytes + st.held_bytes, 3 * 8 * kAlign) << i;
    }
    play_index();
    co->IndexReleased(retired);
    retired.clear();
    EXPECT_EQ(co->stats().held_bytes, 0u);
  }
  EXPECT_EQ(co->stats().evicted, 20u - co->stats().object_count);
  EXPECT_GE(co->stats().evicted, 15u);
  // The index stops giving ranges back (hosts hold leases): the bytes ahead carry three more
  // reserves without a wait; the fourth has to wait for the index (and fails here at once).
  for (int i = 20; i < 23; ++i) {
    auto g = co->Reserve("t", e, {Item(i, 8)}, i);
    ASSERT_TRUE(g.ok()) << i << ": " << g.status();
    play_index();
  }
  auto g = co->Reserve("t", e, {Item(23, 8)}, 23);
  EXPECT_EQ(g.status().code(), absl::StatusCode::kResourceExhausted) << g.status();
  EXPECT_NE(g.status().message().find("index"), std::string::npos) << g.status();
  play_index();
  co->IndexReleased(retired);
  EXPECT_TRUE(co->Reserve("t", e, {Item(23, 8)}, 24).ok());
}

// Without the index nothing is held: eviction frees at once, as before the link.
TEST_F(CoordinatorTest, WithoutTheIndexEvictionFreesAtOnce) {
  c_.index = false;
  auto co = Open();
  co->AttachIndex({});
  for (int i = 0; i < 8; ++i) Put(*co, "t", i, 0, 8);
  EXPECT_TRUE(co->TakeIndexOps().empty());
  auto g = co->Reserve("t", co->region().region_epoch, {Item(100, 8)}, 1);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ(co->stats().held_bytes, 0u);
}

// An object the index evicted (or refused) is served over HTTP only: its eviction later frees
// at once. A restarted coordinator reconciles with the index: an entry of an object it
// evicted before the restart holds that range, live objects already there are not offered
// again, the rest are.
TEST_F(CoordinatorTest, ARestartReconcilesWithWhatTheIndexHolds) {
  c_.index_wait_ms = 0;
  c_.evict_ahead_bytes = 0;
  std::vector<Handle> h;
  std::vector<coherence::PrefixOwner::OwnEntry> own;
  {
    auto co = Open();
    co->AttachIndex({});
    for (int i = 0; i < 8; ++i) h.push_back(Put(*co, "t", i, 0, 8));
    for (const auto& op : co->TakeIndexOps()) own.push_back({op.ns, op.key, op.ref, true});
    // The index let object 7 go on its own: no longer indexed.
    co->IndexReleased({own[7].ref});
    EXPECT_EQ(co->stats().indexed, 7u);
    own.pop_back();
    // Object 0 evicted: its entry is retired (the restart comes before the reclaim).
    EXPECT_FALSE(co->Reserve("t", co->region().region_epoch, {Item(100, 8)}, 1).ok());
    own[0].published = false;
  }
  auto co = Open();
  EXPECT_EQ(co->stats().object_count, 7u);
  EXPECT_EQ(co->stats().used_bytes, 7 * 8 * kAlign) << "before the index: 0's range looks free";
  co->AttachIndex(own);
  EXPECT_EQ(co->stats().held_bytes, 8 * kAlign);
  EXPECT_EQ(co->stats().used_bytes, kRegion);
  auto ops = co->TakeIndexOps();
  ASSERT_EQ(ops.size(), 1u) << "only object 7, which the index no longer has, is offered";
  EXPECT_TRUE(ops[0].publish);
  EXPECT_EQ(RefOf(ops[0])->offset, h[7].offset);
  EXPECT_EQ(co->stats().indexed, 7u);
  co->IndexReleased({own[0].ref});
  EXPECT_EQ(co->stats().held_bytes, 0u);
  auto g = co->Reserve("t", co->region().region_epoch, {Item(100, 8)}, 2);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)[0]->handle.offset, h[0].offset);
}

TEST(CoordinatorConfigTest, SectionAndTokens) {
  auto off = ParseCoordinatorConfig("[domain]\nname = \"d\"\n", "x.toml");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->enabled());
  auto c = ParseCoordinatorConfig(
      "[lmcache]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"/t\"\nlayout_id = \"L\"\n"
      "region_size = \"128M\"\n[lmcache.quotas]\nacme = \"64M\"\n",
      "x.toml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->quotas.at("acme"), 64u << 20);
  EXPECT_EQ(HostPoolBytes(*c, 1ull << 30, 64u << 20), (1ull << 30) - (128u << 20));
  ASSERT_TRUE(ResolveCoordinatorConfig(&*c, "dom", "/s", 64u << 20).ok());
  EXPECT_EQ(c->region_id, "dom");
  EXPECT_EQ(c->state_file, "/s.lmcache");
  EXPECT_TRUE(c->index) << "the index link is on by default";
  EXPECT_EQ(c->evict_ahead_bytes, (128u << 20) / 64) << "a 64th of the region by default";
  // A region of any size: the extents that hold it are the coordinator's (LMCache's tests use
  // 64 KiB); the rest of the last one is no one's.
  auto odd = *c;
  odd.region_bytes = 100u << 20;
  EXPECT_TRUE(ResolveCoordinatorConfig(&odd, "dom", "/s", 64u << 20).ok());
  EXPECT_EQ(HostPoolBytes(odd, 1ull << 30, 64u << 20), (1ull << 30) - (128u << 20));
  odd.region_bytes = 64u << 10;
  odd.evict_ahead_bytes = CoordinatorConfig::kEvictAheadDefault;  // resolved above: 2 MiB
  const auto small = ResolveCoordinatorConfig(&odd, "dom", "/s", 64u << 20);
  EXPECT_TRUE(small.ok()) << small;
  EXPECT_EQ(odd.evict_ahead_bytes, (64u << 10) / 64);
  EXPECT_EQ(HostPoolBytes(odd, 1ull << 30, 64u << 20), (1ull << 30) - (64u << 20));
  EXPECT_EQ(HostPoolBytes(odd, (1ull << 30) + 12345, 64u << 20), (1ull << 30) - (64u << 20))
      << "the pool's tail past its last whole extent is no one's";
  const std::string base =
      "[lmcache]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"/t\"\nlayout_id = \"L\"\n"
      "region_size = \"128M\"\n";
  auto idx = ParseCoordinatorConfig(base + "index = false\nindex_wait_ms = 50\nevict_ahead = 0\n",
                                    "x.toml");
  ASSERT_TRUE(idx.ok()) << idx.status();
  EXPECT_FALSE(idx->index);
  EXPECT_EQ(idx->index_wait_ms, 50u);
  ASSERT_TRUE(ResolveCoordinatorConfig(&*idx, "dom", "/s", 64u << 20).ok());
  EXPECT_EQ(idx->evict_ahead_bytes, 0u) << "0 stays 0";
  auto greedy = ParseCoordinatorConfig(base + "evict_ahead = \"65M\"\n", "x.toml");
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  const auto half = ResolveCoordinatorConfig(&*greedy, "dom", "/s", 64u << 20);
  EXPECT_NE(half.message().find("lmcache.evict_ahead"), std::string::npos) << half;
  EXPECT_FALSE(ParseCoordinatorConfig(base + "index = 1\n", "x.toml").ok()) << "not a boolean";
  auto typo =
      ParseCoordinatorConfig("[lmcache]\nlisten = \"127.0.0.1:0\"\nlayout = \"L\"\n", "x.toml");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("x.toml:3: key 'lmcache.layout': unknown key"),
            std::string::npos)
      << typo.status();
  auto missing = ParseCoordinatorConfig("[lmcache]\nlisten = \"127.0.0.1:0\"\n", "x.toml");
  EXPECT_NE(missing.status().message().find("lmcache.token_file"), std::string::npos);

  const auto dir = std::filesystem::temp_directory_path() / absl::StrCat("cxlkv-tok-", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string f = (dir / "tokens").string();
  auto write = [&](const std::string& text, std::filesystem::perms p) {
    { std::ofstream(f) << text; }
    std::filesystem::permissions(f, p);
  };
  using P = std::filesystem::perms;
  write("# tenants\nacme aaaaaaaaaaaaaaaaaaaa\nbatch bbbbbbbbbbbbbbbbbbbb\n",
        P::owner_read | P::owner_write);
  auto t = LoadTenantTokens(f);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->at("aaaaaaaaaaaaaaaaaaaa"), "acme");
  write("cccccccccccccccccccc\n", P::owner_read | P::owner_write);
  EXPECT_EQ(LoadTenantTokens(f)->at("cccccccccccccccccccc"), "default");
  write("cccccccccccccccccccc\n", P::owner_read | P::owner_write | P::group_read | P::others_read);
  const absl::Status readable = LoadTenantTokens(f).status();
  EXPECT_EQ(readable.code(), absl::StatusCode::kPermissionDenied);
  // The mode in octal as chmod takes it (it was printed in hex: "1a4"), the fix and the setting.
  EXPECT_NE(readable.message().find("mode 0644"), std::string::npos) << readable;
  EXPECT_NE(readable.message().find("chmod 600 " + f), std::string::npos) << readable;
  EXPECT_NE(readable.message().find("lmcache.token_file_readable = true"), std::string::npos);
  // LMCache's behaviour one setting away: accepted, with a warning naming the file and mode.
  std::string warning;
  auto accepted = LoadTenantTokens(f, {.accept_readable = true}, &warning);
  ASSERT_TRUE(accepted.ok()) << accepted.status();
  EXPECT_EQ(accepted->at("cccccccccccccccccccc"), "default");
  EXPECT_NE(warning.find(f), std::string::npos) << warning;
  EXPECT_NE(warning.find("0644"), std::string::npos) << warning;
  auto set = ParseCoordinatorConfig(
      "[lmcache]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"t\"\nlayout_id = \"l\"\n"
      "region_size = \"64M\"\ntoken_file_readable = true\n",
      "x.toml");
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_TRUE(set->token_file_readable);
  write("acme short\n", P::owner_read | P::owner_write);
  const absl::Status short_token = LoadTenantTokens(f).status();
  EXPECT_NE(short_token.message().find(":1:"), std::string::npos) << short_token;
  // LMCache accepts a token of any length: 5 characters here, refused by default with its
  // length and the setting, accepted with lmcache.token_min_length.
  EXPECT_NE(short_token.message().find("a token of 5 characters is shorter than 16"),
            std::string::npos)
      << short_token;
  EXPECT_NE(short_token.message().find("lmcache.token_min_length = 5"), std::string::npos)
      << short_token;
  auto short_ok = LoadTenantTokens(f, {.min_length = 5});
  ASSERT_TRUE(short_ok.ok()) << short_ok.status();
  EXPECT_EQ(short_ok->at("short"), "acme");
  write("tok\x7f\n", P::owner_read | P::owner_write);
  EXPECT_NE(LoadTenantTokens(f, {.min_length = 1}).status().message().find("printable ASCII"),
            std::string::npos)
      << "a token of any length is still printable ASCII";
  auto min_len = ParseCoordinatorConfig(
      "[lmcache]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"t\"\nlayout_id = \"l\"\n"
      "region_size = \"64M\"\ntoken_min_length = 1\n",
      "x.toml");
  ASSERT_TRUE(min_len.ok()) << min_len.status();
  EXPECT_EQ(min_len->token_min_length, 1u);
  EXPECT_FALSE(
      ParseCoordinatorConfig("[lmcache]\nlisten = \"127.0.0.1:0\"\ntoken_file = \"t\"\nlayout_id = "
                             "\"l\"\nregion_size = \"64M\"\ntoken_min_length = 0\n",
                             "x.toml")
          .ok())
      << "at least one character";
  write("a aaaaaaaaaaaaaaaaaaaa\nb aaaaaaaaaaaaaaaaaaaa\n", P::owner_read | P::owner_write);
  EXPECT_NE(LoadTenantTokens(f).status().message().find("already listed"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cxlkv::coordinator
