// The LMCache coordinator's state in etcd (orchestrator/lmcache/src/etcd_store.cc,
// docs/lmcache.md "The state in etcd") on a real etcd whose request limit is small
// (--max-request-bytes=32768), so a few hundred objects make a snapshot no single request
// can carry: it is saved as a generation of several chunks and a head, a takeover by a new
// leader restores every object and handle from it, a process killed between the chunk writes
// and the flip leaves the old generation live, the earlier single-value form is read and
// replaced, and a missing chunk or a deposed leader's write is refused.
//
// The kill: the test binary runs itself again (CXLKV_COORD_ETCD_CHILD in its environment) as
// a leader whose store stops once the new generation's chunks are written, and SIGKILLs it.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cxlkv/orchestrator/lmcache/coordinator.h"
#include "cxlkv/orchestrator/lmcache/etcd_store.h"
#include "cxlkv/orchestrator/lmcache/service.h"
#include "etcd_cluster.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace cxlkv::coordinator {
namespace {

namespace ed = ::cxlkv::orchestrator::etcd;
using json = nlohmann::json;

constexpr std::uint64_t kAlign = 4096;
constexpr std::uint64_t kRegion = 2048 * kAlign;
constexpr std::uint64_t kOffset = 1ull << 30;
constexpr int kMaxRequest = 32768;  // etcd's --max-request-bytes here
constexpr const char* kDomain = "/cxlkv/v1/test/domains/d0";
constexpr const char* kChildEnv = "CXLKV_COORD_ETCD_CHILD";

CoordinatorConfig Config() {
  CoordinatorConfig c;
  c.listen = "127.0.0.1:0";
  c.token_file = "/nonexistent";
  c.region_id = "r0";
  c.layout_id = "L1";
  c.region_bytes = kRegion;
  c.alignment_bytes = kAlign;
  c.reservation_ttl_ms = 600000;
  c.read_lease_ms = 500;
  return c;
}

EtcdPlace Place(const std::vector<std::string>& endpoints) {
  EtcdPlace p;
  p.client.endpoints = endpoints;
  p.domain_key = kDomain;
  p.client.call_timeout_ms = 5000;
  return p;
}

ObjectKey Key(int i) {
  char hex[33];
  std::snprintf(hex, sizeof hex, "%016x%016x", i, i * 7919);
  return ObjectKey{hex, "meta-llama/Llama-3.1-8B-Instruct", i % 4, 0, ""};
}
ReserveItem Item(int i) {
  return ReserveItem{Key(i), Layout{{{static_cast<std::int64_t>(kAlign / 2)}}, {"float16"}}};
}

// The keys whose values differ between a and b ("" : none), for short failure messages.
std::string Differ(const std::map<std::string, std::string>& a,
                   const std::map<std::string, std::string>& b) {
  std::string out;
  for (const auto& [k, v] : a) {
    auto it = b.find(k);
    if (it == b.end() || it->second != v) absl::StrAppend(&out, k, " ");
  }
  for (const auto& [k, v] : b) {
    if (!a.count(k)) absl::StrAppend(&out, k, " ");
  }
  return out;
}

bool SameHandle(const Handle& a, const Handle& b) {
  return a.offset == b.offset && a.length == b.length && a.generation == b.generation;
}

// What the coordinator holds, as its clients saw it.
struct Expected {
  std::string epoch;
  std::map<int, Handle> valid;
  std::map<int, std::pair<std::string, Handle>> writing;  // token, handle
  std::set<int> gone;
  std::uint64_t used_bytes = 0, object_count = 0;
};

class CoordinatorEtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CXLKV_SKIP_WITHOUT_ETCD();
    etcd_ = std::make_unique<testing::EtcdCluster>(1);
    etcd_->AddArgs({absl::StrCat("--max-request-bytes=", kMaxRequest)});
    std::string why;
    ASSERT_TRUE(etcd_->Start(&why)) << why;
    client_ = etcd_->NewClient(5000);
    ASSERT_NE(client_, nullptr);
  }

  // A new leader of the domain: the leader key made afresh; its create revision is the epoch.
  std::int64_t NewLeader() {
    const std::string k = absl::StrCat(kDomain, "/leader");
    EXPECT_TRUE(client_->Delete(k).ok());
    EXPECT_TRUE(client_->Put(k, "test").ok());
    auto r = client_->Get(k);
    EXPECT_TRUE(r.ok() && r->kvs.size() == 1);
    return r.ok() && !r->kvs.empty() ? r->kvs[0].create_revision : 0;
  }

  absl::StatusOr<std::unique_ptr<Coordinator>> TryOpen(std::int64_t epoch) {
    auto store = EtcdStateStore(Place(etcd_->endpoints()), epoch);
    if (!store.ok()) return store.status();
    return Coordinator::Open(Config(), kOffset, 0, *std::move(store));
  }
  std::unique_ptr<Coordinator> Open(std::int64_t epoch) {
    auto co = TryOpen(epoch);
    EXPECT_TRUE(co.ok()) << co.status();
    return co.ok() ? *std::move(co) : nullptr;
  }

  // Every key under <domain>/lmcache/, with its value.
  std::map<std::string, std::string> Keys() {
    const std::string p = absl::StrCat(kDomain, "/lmcache/");
    auto r = client_->Get(p, ed::PrefixEnd(p));
    EXPECT_TRUE(r.ok()) << r.status();
    std::map<std::string, std::string> out;
    if (r.ok()) {
      for (const auto& kv : r->kvs) out[kv.key.substr(p.size())] = kv.value;
    }
    return out;
  }
  json Head() {
    auto keys = Keys();
    return keys.count("head") ? json::parse(keys["head"]) : json();
  }
  // The chunk keys of one generation (or of every generation but `except`).
  std::map<std::string, std::string> Chunks(const std::string& gen, bool except = false) {
    std::map<std::string, std::string> out;
    for (const auto& [k, v] : Keys()) {
      if (!absl::StartsWith(k, "gen/")) continue;
      const bool mine = absl::StartsWith(k, absl::StrCat("gen/", gen, "/"));
      if (mine != except) out[k] = v;
    }
    return out;
  }

  // Reserves keys [from, from + n) in batches of 20 and finishes the first `finish` of them.
  void Fill(Coordinator& co, Expected* e, int from, int n, int finish) {
    e->epoch = co.region().region_epoch;
    for (int b = from; b < from + n; b += 20) {
      std::vector<ReserveItem> items;
      for (int i = b; i < std::min(from + n, b + 20); ++i) items.push_back(Item(i));
      auto g = co.Reserve("t", e->epoch, items, 1);
      ASSERT_TRUE(g.ok()) << g.status();
      std::vector<ReservationRef> fin;
      for (std::size_t j = 0; j < items.size(); ++j) {
        ASSERT_TRUE((*g)[j].has_value());
        const int i = b + static_cast<int>(j);
        if (i < from + finish) {
          fin.push_back({(*g)[j]->key, (*g)[j]->token});
          e->valid[i] = (*g)[j]->handle;
        } else {
          e->writing[i] = {(*g)[j]->token, (*g)[j]->handle};
        }
      }
      if (!fin.empty()) {
        ASSERT_TRUE(co.Finish("t", e->epoch, fin, 2).ok());
      }
    }
    e->used_bytes = co.stats().used_bytes;
    e->object_count = co.stats().object_count;
  }

  // The restored coordinator holds exactly `e`: the epoch, the counts, every finished
  // object's handle, nothing that was aborted; then every open reservation is finished with
  // its writer's token and keeps its handle, and a new grant's generation is above them all.
  void ExpectHolds(Coordinator& co, const Expected& e) {
    EXPECT_TRUE(co.restored());
    ASSERT_EQ(co.region().region_epoch, e.epoch);
    EXPECT_EQ(co.stats().used_bytes, e.used_bytes);
    EXPECT_EQ(co.stats().object_count, e.object_count);
    std::vector<ObjectKey> keys;
    std::vector<int> ids;
    for (const auto& [i, h] : e.valid) keys.push_back(Key(i)), ids.push_back(i);
    auto hits = co.Lookup("t", e.epoch, keys, 3);
    ASSERT_TRUE(hits.ok()) << hits.status();
    std::uint64_t max_gen = 0;
    for (std::size_t j = 0; j < ids.size(); ++j) {
      ASSERT_TRUE((*hits)[j].has_value()) << "object " << ids[j] << " lost";
      EXPECT_TRUE(SameHandle((*hits)[j]->handle, e.valid.at(ids[j]))) << "object " << ids[j];
      max_gen = std::max(max_gen, e.valid.at(ids[j]).generation);
    }
    std::vector<ObjectKey> absent;
    for (int i : e.gone) absent.push_back(Key(i));
    for (const auto& [i, w] : e.writing) absent.push_back(Key(i));
    auto none = co.Lookup("t", e.epoch, absent, 3);
    ASSERT_TRUE(none.ok()) << none.status();
    for (const auto& h : *none) EXPECT_FALSE(h.has_value());
    std::vector<ReservationRef> fin;
    std::vector<ObjectKey> wkeys;
    for (const auto& [i, w] : e.writing) {
      fin.push_back({Key(i), w.first});
      wkeys.push_back(Key(i));
      max_gen = std::max(max_gen, w.second.generation);
    }
    if (!fin.empty()) {
      ASSERT_TRUE(co.Finish("t", e.epoch, fin, 4).ok());
      auto wh = co.Lookup("t", e.epoch, wkeys, 5);
      ASSERT_TRUE(wh.ok());
      std::size_t j = 0;
      for (const auto& [i, w] : e.writing) {
        ASSERT_TRUE((*wh)[j].has_value()) << "reservation " << i;
        EXPECT_TRUE(SameHandle((*wh)[j]->handle, w.second)) << "reservation " << i;
        ++j;
      }
    }
    auto g = co.Reserve("t", e.epoch, {Item(100000)}, 6);
    ASSERT_TRUE(g.ok()) << g.status();
    ASSERT_TRUE((*g)[0].has_value());
    EXPECT_GT((*g)[0]->handle.generation, max_gen);
  }

  // The head names `gen` of more than one chunk, none larger than a request, no journal and no
  // other generation are left, and the chunks add up to the head's bytes.
  void ExpectCompacted(std::int64_t epoch, std::string* gen) {
    const json h = Head();
    ASSERT_TRUE(h.is_object()) << "no head";
    *gen = h.at("generation").get<std::string>();
    EXPECT_TRUE(absl::StartsWith(*gen, absl::StrFormat("%020d-", epoch))) << *gen;
    const auto chunks = Chunks(*gen);
    EXPECT_EQ(chunks.size(), h.at("chunks").get<std::size_t>());
    EXPECT_GE(chunks.size(), 3u);
    std::size_t bytes = 0;
    for (const auto& [k, v] : chunks) {
      EXPECT_LT(v.size(), static_cast<std::size_t>(kMaxRequest)) << k;
      bytes += v.size();
    }
    EXPECT_EQ(bytes, h.at("bytes").get<std::size_t>());
    EXPECT_GT(bytes, static_cast<std::size_t>(kMaxRequest));  // one request could not carry it
    EXPECT_TRUE(Chunks(*gen, /*except=*/true).empty());
    for (const auto& [k, v] : Keys()) {
      EXPECT_FALSE(absl::StartsWith(k, "journal/")) << k;
      EXPECT_NE(k, "snapshot");
    }
  }

  std::unique_ptr<testing::EtcdCluster> etcd_;
  std::unique_ptr<ed::Client> client_;
};

// 300 objects (280 finished, 20 reserved): a takeover compacts them into a generation of
// several chunks (the chunk size found by halving from 1 MiB while etcd refuses), and the
// next leader restores every object and handle from it. Before chunking, the takeover's
// compaction could not be written and the new leader did not start.
TEST_F(CoordinatorEtcdTest, LargeStateIsSavedInChunksAndRestoredOnTakeover) {
  Expected e;
  {
    auto co = Open(NewLeader());
    ASSERT_NE(co, nullptr);
    Fill(*co, &e, 0, 300, 280);
  }
  const std::int64_t second = NewLeader();
  std::string gen;
  {
    auto co = Open(second);  // loads the journal and compacts it
    ASSERT_NE(co, nullptr);
    ExpectCompacted(second, &gen);
    EXPECT_EQ(Head().at("journal_seq").get<std::uint64_t>(), 29u);  // 15 reserves, 14 finishes
  }
  const std::int64_t third = NewLeader();
  auto co = Open(third);
  ASSERT_NE(co, nullptr);
  std::string gen3;
  ExpectCompacted(third, &gen3);  // the old generation is gone with the flip
  EXPECT_NE(gen3, gen);
  ExpectHolds(*co, e);
}

// The kill between the chunk writes and the flip: the new generation's chunks are in etcd,
// the head still names the old one, and the next leader restores the old generation and the
// journal after it (every change since, none lost), then removes the half-written one.
TEST_F(CoordinatorEtcdTest, KillBetweenChunksAndFlipLeavesTheOldGenerationLive) {
  Expected e;
  {
    auto co = Open(NewLeader());
    ASSERT_NE(co, nullptr);
    Fill(*co, &e, 0, 300, 280);
  }
  std::string old_gen;
  {
    const std::int64_t epoch = NewLeader();
    auto co = Open(epoch);
    ASSERT_NE(co, nullptr);
    ExpectCompacted(epoch, &old_gen);
    // Changes after the snapshot, in the journal: 5 reservations aborted, 5 finished, 10 new
    // objects.
    std::vector<ReservationRef> abort, finish;
    for (int i = 280; i < 290; ++i) {
      (i < 285 ? abort : finish).push_back({Key(i), e.writing[i].first});
    }
    ASSERT_TRUE(co->Abort("t", e.epoch, abort, 3).ok());
    ASSERT_TRUE(co->Finish("t", e.epoch, finish, 3).ok());
    for (int i = 280; i < 290; ++i) {
      if (i < 285) {
        e.gone.insert(i);
      } else {
        e.valid[i] = e.writing[i].second;
      }
      e.writing.erase(i);
    }
    Expected more;
    Fill(*co, &more, 1000, 10, 10);
    e.valid.insert(more.valid.begin(), more.valid.end());
    e.used_bytes = co->stats().used_bytes;
    e.object_count = co->stats().object_count;
  }
  const auto before = Keys();
  // Records 30..33 after the snapshot's 29: the abort, the finish, the reserve and its finish.
  ASSERT_EQ(before.count("journal/00000000000000000033"), 1u);

  // A leader that dies between its chunk writes and the flip.
  const std::int64_t doomed = NewLeader();
  const std::string spec = absl::StrCat(etcd_->endpoints()[0], ";", doomed);
  int out[2];
  ASSERT_EQ(::pipe(out), 0);
  const std::string env = absl::StrCat(kChildEnv, "=", spec);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::close(out[0]);
    char* argv[] = {const_cast<char*>("coordinator_etcd_test"), nullptr};
    char* envp[] = {const_cast<char*>(env.c_str()), nullptr};
    ::execve("/proc/self/exe", argv, envp);
    ::_exit(127);
  }
  ::close(out[1]);
  std::string said;
  pollfd p{out[0], POLLIN, 0};
  while (said.find('\n') == std::string::npos && ::poll(&p, 1, 20000) == 1) {
    char buf[256];
    const ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n <= 0) break;
    said.append(buf, static_cast<std::size_t>(n));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(out[0]);
  ASSERT_EQ(said, "chunks written\n");
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

  // The dead leader's chunks are there; nothing the old generation needs has changed.
  const std::string doomed_gen = absl::StrFormat("%020d-%010u", doomed, 1);
  const auto half = Chunks(doomed_gen);
  EXPECT_GE(half.size(), 3u);
  auto after = Keys();
  for (const auto& [k, v] : half) after.erase(k);
  EXPECT_EQ(Differ(after, before), "");

  const std::int64_t next = NewLeader();
  auto co = Open(next);
  ASSERT_NE(co, nullptr);
  std::string gen;
  ExpectCompacted(next, &gen);  // the half-written generation and the old one are gone
  ExpectHolds(*co, e);
}

// An earlier cxlkv's single value (<domain>/lmcache/snapshot, no head) is read, and the first
// compaction replaces it with a generation. A chunk missing from the live generation stops
// the start naming it, and changes nothing; a deposed leader's compaction writes no chunk.
TEST_F(CoordinatorEtcdTest, SingleValueFormIsReadAndReplacedAndDamageIsRefused) {
  Expected e;
  {
    auto co = Open(NewLeader());
    ASSERT_NE(co, nullptr);
    Fill(*co, &e, 0, 40, 30);  // fits one request
  }
  std::string gen;
  {
    auto co = Open(NewLeader());
    ASSERT_NE(co, nullptr);
  }
  // The same state as an earlier cxlkv kept it.
  {
    const json h = Head();
    gen = h.at("generation").get<std::string>();
    std::string text;
    for (const auto& [k, v] : Chunks(gen)) text += v;
    const std::string p = absl::StrCat(kDomain, "/lmcache/");
    ASSERT_TRUE(client_->Delete(p, ed::PrefixEnd(p)).ok());
    ASSERT_TRUE(client_->Put(p + "snapshot", text).ok());
  }
  {
    const std::int64_t epoch = NewLeader();
    auto co = Open(epoch);
    ASSERT_NE(co, nullptr);
    ExpectHolds(*co, e);
    const auto keys = Keys();
    EXPECT_EQ(keys.count("snapshot"), 0u);
    gen = Head().at("generation").get<std::string>();
    EXPECT_TRUE(absl::StartsWith(gen, absl::StrFormat("%020d-", epoch)));
    Expected more;
    Fill(*co, &more, 2000, 300, 300);  // several chunks from the next compaction on
  }
  // An earlier cxlkv led after this one: it found no single value, started the region afresh
  // (a new epoch), and its compaction wrote the single value and removed the records; the
  // head and its generation stay. Its state is the one loaded, not the head's. (That state
  // is made here by a coordinator on a state file: the same text.)
  Expected older;
  std::string older_text;
  {
    CoordinatorConfig c = Config();
    c.state_file = absl::StrCat("/dev/shm/cxlkv-coordinator-etcd-test-", ::getpid(), ".state");
    for (int n = 0; n < 2; ++n) {  // the second open folds the journal into the file
      auto co = Coordinator::Open(c, kOffset, 0);
      ASSERT_TRUE(co.ok()) << co.status();
      if (n == 0) Fill(**co, &older, 5000, 20, 15);
    }
    std::ifstream in(c.state_file, std::ios::binary);
    older_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    std::remove(c.state_file.c_str());
    std::remove((c.state_file + ".journal").c_str());
  }
  ASSERT_NE(older.epoch, e.epoch);
  {
    const std::string p = absl::StrCat(kDomain, "/lmcache/");
    ASSERT_TRUE(client_->Delete(p + "journal/", ed::PrefixEnd(p + "journal/")).ok());
    ASSERT_TRUE(client_->Put(p + "snapshot", older_text).ok());
    auto co = Open(NewLeader());
    ASSERT_NE(co, nullptr);
    EXPECT_EQ(Keys().count("snapshot"), 0u);
    ExpectHolds(*co, older);
    Expected more;
    Fill(*co, &more, 3000, 300, 300);  // several chunks from the next compaction on
  }
  // A deposed leader: every chunk write is refused, nothing is written. (Its coordinator
  // opened twice in one term: the second compaction names a generation of its own, never
  // the live one's.)
  const std::int64_t old_epoch = NewLeader();
  for (int n = 1; n <= 2; ++n) {
    auto co = Open(old_epoch);
    ASSERT_NE(co, nullptr);
    EXPECT_EQ(Head().at("generation"), absl::StrFormat("%020d-%010u", old_epoch, n));
  }
  const auto before = Keys();
  NewLeader();
  {
    auto store = EtcdStateStore(Place(etcd_->endpoints()), old_epoch);
    ASSERT_TRUE(store.ok());
    const absl::Status st = (*store)->Compact("anything", 1);
    EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
    EXPECT_TRUE(absl::StrContains(st.message(), "no longer leads")) << st;
  }
  EXPECT_EQ(Differ(Keys(), before), "");
  // A chunk gone: the start stops naming it and the head.
  gen = Head().at("generation").get<std::string>();
  const std::string lost = absl::StrCat(kDomain, "/lmcache/gen/", gen, "/0000000001");
  ASSERT_EQ(client_->Delete(lost).value_or(0), 1);
  const auto damaged = Keys();
  auto co = TryOpen(NewLeader());
  ASSERT_FALSE(co.ok());
  EXPECT_EQ(co.status().code(), absl::StatusCode::kDataLoss) << co.status();
  EXPECT_TRUE(absl::StrContains(co.status().message(), lost)) << co.status();
  EXPECT_TRUE(absl::StrContains(co.status().message(), "names")) << co.status();
  EXPECT_EQ(Differ(Keys(), damaged), "");
}

// The store alone: a snapshot of 700 KB, larger than etcd's gRPC receive limit
// (--max-request-bytes + 512 KiB: its first refusal is gRPC's, not etcd's), comes back byte
// for byte from chunks under the limit, with the journal after it read a few records per
// request (a window full, then a part; and windows that end exactly at the last record).
TEST_F(CoordinatorEtcdTest, StoreRoundTripsASnapshotPastGrpcsLimitAndAJournalInWindows) {
  const std::int64_t epoch = NewLeader();
  EtcdPlace place = Place(etcd_->endpoints());
  place.journal_read_batch = 4;
  std::string text(700 * 1024, ' ');
  std::uint64_t x = 88172645463325252ull;
  for (char& c : text) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>('!' + x % 90);
  }
  {
    auto store = EtcdStateStore(place, epoch);
    ASSERT_TRUE(store.ok());
    auto none = (*store)->Load();
    ASSERT_TRUE(none.ok()) << none.status();
    EXPECT_FALSE(none->has_value());
    ASSERT_TRUE((*store)->Compact(text, 7).ok());
    for (int seq = 8; seq <= 15; ++seq) {
      ASSERT_TRUE((*store)->Append(seq, absl::StrCat("record ", seq, "\n")).ok());
    }
  }
  const json h = Head();
  ASSERT_TRUE(h.is_object());
  const auto chunks = Chunks(h.at("generation").get<std::string>());
  EXPECT_GT(chunks.size(), 700u * 1024 / kMaxRequest);
  for (const auto& [k, v] : chunks) EXPECT_LT(v.size(), static_cast<std::size_t>(kMaxRequest));
  std::string want_journal;
  for (int seq = 8; seq <= 15; ++seq) absl::StrAppend(&want_journal, "record ", seq, "\n");
  for (int more = 0; more < 2; ++more) {
    auto store = EtcdStateStore(place, epoch);
    ASSERT_TRUE(store.ok());
    auto loaded = (*store)->Load();
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    ASSERT_TRUE(loaded->has_value());
    EXPECT_TRUE((*loaded)->snapshot == text);
    // 8 records (windows of 4, 4 and an empty one), then 9 (4, 4 and 1).
    EXPECT_EQ((*loaded)->journal, want_journal);
    const int seq = 16 + more;
    ASSERT_TRUE((*store)->Append(seq, absl::StrCat("record ", seq, "\n")).ok());
    absl::StrAppend(&want_journal, "record ", seq, "\n");
  }
}

// The child: a leader of the epoch in its environment that loads the state and compacts it,
// and stops for good once the new generation's chunks are written (the parent kills it).
int CompactAndStopBeforeFlip(const std::string& spec) {
  std::vector<std::string> parts = absl::StrSplit(spec, ';');
  std::int64_t epoch = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &epoch)) {
    std::fprintf(stderr, "%s: want ENDPOINT;EPOCH, got '%s'\n", kChildEnv, spec.c_str());
    return 2;
  }
  EtcdPlace place = Place({parts[0]});
  place.before_flip = [] {
    const char said[] = "chunks written\n";
    if (::write(1, said, sizeof said - 1) < 0) std::_Exit(3);
    for (;;) ::pause();
  };
  auto store = EtcdStateStore(place, epoch);
  if (!store.ok()) {
    std::fprintf(stderr, "child: %s\n", std::string(store.status().message()).c_str());
    return 1;
  }
  auto co = Coordinator::Open(Config(), kOffset, 0, *std::move(store));
  std::fprintf(stderr, "child: Open returned before the flip: %s\n",
               co.ok() ? "ok" : std::string(co.status().message()).c_str());
  return 1;
}

}  // namespace
}  // namespace cxlkv::coordinator

int main(int argc, char** argv) {
  if (const char* spec = std::getenv(cxlkv::coordinator::kChildEnv); spec != nullptr) {
    return cxlkv::coordinator::CompactAndStopBeforeFlip(spec);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
