// The coordinator's state in etcd, for a domain with [etcd] (docs/lmcache.md "Fail-over",
// "The state in etcd"), under <domain key>/lmcache/:
//   head                        which snapshot generation is live: its name, chunk count,
//                               byte count, CRC32C, and the last journal record it holds
//   gen/<generation>/<chunk>    the snapshot's text in chunks (each one etcd request)
//   journal/<seq, 20 digits>    one record per change after the snapshot
//   snapshot                    the earlier single-value form: read when there is no head,
//                               deleted by the first flip
// Every write is a transaction guarded by the leader key's create revision (the leader's
// epoch), as the daemon's own state writes are. A compaction writes the new generation's
// chunks first, one transaction each, then flips the head to it in one transaction that also
// deletes the journal, every other generation and the old single value: until the flip the
// old generation is the live one, whatever happened to the chunk writes.
#include "cxlkv/orchestrator/lmcache/etcd_store.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "cxlkv/coherence/crc32c.h"
#include "nlohmann/json.hpp"

namespace cxlkv::coordinator {
namespace {

namespace ed = ::cxlkv::orchestrator::etcd;
using json = nlohmann::json;

constexpr std::uint32_t kMinChunkBytes = 1024;
constexpr int kLoadAttempts = 3;  // a head that moved while read: read again

std::string Crc(const std::string& s) {
  return absl::StrCat(absl::Hex(coherence::Crc32c(s.data(), s.size()), absl::kZeroPad8));
}

// etcd refused a request for its size: its own check of --max-request-bytes
// (InvalidArgument "etcdserver: request is too large") or gRPC's receive limit just above it
// (ResourceExhausted "... larger than max ..."). Not etcd's other ResourceExhausted errors
// (a full database, too many requests): those stop the compaction as they are.
bool TooLarge(const absl::Status& st) {
  const std::string m = absl::AsciiStrToLower(st.message());
  return (st.code() == absl::StatusCode::kInvalidArgument ||
          st.code() == absl::StatusCode::kResourceExhausted) &&
         (absl::StrContains(m, "too large") || absl::StrContains(m, "larger than max"));
}

// A generation's name: the epoch of the leader that wrote it and that leader's count, both
// fixed width, so names sort by age and never repeat (a new leader has a larger epoch).
std::string GenerationName(std::int64_t epoch, std::uint64_t n) {
  return absl::StrFormat("%020d-%010u", epoch, n);
}
bool ParseGeneration(const std::string& name, std::int64_t* epoch, std::uint64_t* n) {
  std::vector<std::string> parts = absl::StrSplit(name, '-');
  return name.size() == 31 && parts.size() == 2 && absl::SimpleAtoi(parts[0], epoch) &&
         absl::SimpleAtoi(parts[1], n);
}

class EtcdStore : public StateStore {
 public:
  EtcdStore(std::unique_ptr<ed::Client> client, const EtcdPlace& place, std::int64_t epoch)
      : client_(std::move(client)),
        leader_(place.domain_key + "/leader"),
        head_(place.domain_key + "/lmcache/head"),
        gens_(place.domain_key + "/lmcache/gen/"),
        legacy_(place.domain_key + "/lmcache/snapshot"),
        journal_(place.domain_key + "/lmcache/journal/"),
        epoch_(epoch),
        chunk_bytes_(std::max(place.snapshot_chunk_bytes, kMinChunkBytes)),
        journal_window_(std::max<std::uint32_t>(place.journal_read_batch, 1)),
        before_flip_(place.before_flip) {}

  absl::StatusOr<std::optional<Loaded>> Load() override {
    for (int attempt = 1;; ++attempt) {
      bool moved = false;
      auto out = LoadOnce(&moved);
      if (!moved || attempt == kLoadAttempts) return out;
    }
  }

  absl::Status Append(std::uint64_t seq, const std::string& record) override {
    return Guarded({ed::Op::Put(RecordKey(seq), record)}, journal_);
  }

  // Every Append is durable when etcd answers it.
  absl::Status Sync() override { return absl::OkStatus(); }

  absl::Status Compact(const std::string& text, std::uint64_t seq) override {
    if (!live_known_) {
      // Compact before any Load: learn the live generation, so the new one is another.
      auto head = client_->Get(head_);
      if (!head.ok()) return Named(head.status(), head_, "read");
      if (!head->kvs.empty()) {
        auto h = ParseHead(head->kvs[0].value);
        if (!h.ok()) return h.status();
        NoteLive(h->generation);
      }
      live_known_ = true;
    }
    const std::string gen = GenerationName(epoch_, ++count_);
    const std::string prefix = gens_ + gen + "/";
    std::uint64_t chunks = 0;
    for (bool done = false; !done;) {
      chunks = std::max<std::uint64_t>(1, (text.size() + chunk_bytes_ - 1) / chunk_bytes_);
      done = true;
      for (std::uint64_t i = 0; i < chunks; ++i) {
        const std::string key = ChunkKey(prefix, i);
        absl::Status st =
            Guarded({ed::Op::Put(key, text.substr(i * chunk_bytes_, chunk_bytes_))}, key);
        if (st.ok()) continue;
        if (TooLarge(st) && chunk_bytes_ / 2 >= kMinChunkBytes) {
          // Smaller chunks, from the first again (they replace what this generation had).
          chunk_bytes_ /= 2;
          done = false;
          break;
        }
        if (TooLarge(st)) {
          return absl::Status(st.code(),
                              absl::StrCat(st.message(), " (even a ", chunk_bytes_,
                                           "-byte chunk of the snapshot is too large for etcd: "
                                           "raise its --max-request-bytes)"));
        }
        return st;
      }
    }
    if (before_flip_) before_flip_();
    json head{{"format", "cxlkv-lmcache-snapshot-head"},
              {"version", 1},
              {"generation", gen},
              {"chunks", chunks},
              {"bytes", text.size()},
              {"crc32c", Crc(text)},
              {"journal_seq", seq}};
    // The flip: the head names the new generation; every record goes (not only those up to
    // seq: one after it is an append whose reply was lost and which the coordinator did not
    // apply), and so does every other generation (the old one, and any a crash left
    // half-written) and the old single value.
    const std::string gens_end = ed::PrefixEnd(gens_);
    if (auto st = Guarded(
            {ed::Op::Put(head_, head.dump()), ed::Op::Delete(journal_, ed::PrefixEnd(journal_)),
             ed::Op::Delete(gens_, prefix), ed::Op::Delete(ed::PrefixEnd(prefix), gens_end),
             ed::Op::Delete(legacy_)},
            head_);
        !st.ok()) {
      return st;
    }
    live_ = gen;
    return absl::OkStatus();
  }

  std::string where() const override {
    if (live_.empty()) return "etcd " + head_;
    return absl::StrCat("etcd ", head_, " (snapshot generation ", live_, " under ", gens_, ")");
  }
  std::string journal_where() const override { return "etcd " + journal_; }

 private:
  struct Head {
    std::string generation;
    std::uint64_t chunks = 0, bytes = 0, journal_seq = 0;
    std::string crc32c;
  };

  absl::StatusOr<Head> ParseHead(const std::string& value) const {
    const json j = json::parse(value, nullptr, false);
    Head h;
    std::int64_t e = 0;
    std::uint64_t n = 0;
    try {
      if (j.is_discarded() || !j.is_object() || j.at("format") != "cxlkv-lmcache-snapshot-head" ||
          j.at("version") != 1) {
        throw std::runtime_error("not a snapshot head of version 1");
      }
      h.generation = j.at("generation").get<std::string>();
      h.chunks = j.at("chunks").get<std::uint64_t>();
      h.bytes = j.at("bytes").get<std::uint64_t>();
      h.crc32c = j.at("crc32c").get<std::string>();
      h.journal_seq = j.at("journal_seq").get<std::uint64_t>();
      if (!ParseGeneration(h.generation, &e, &n) || h.chunks == 0) {
        throw std::runtime_error("a malformed generation or no chunks");
      }
    } catch (const std::exception& ex) {
      return absl::DataLossError(absl::StrCat(
          head_, ": ", ex.what(),
          "; the coordinator will not start on it (nothing is discarded). A newer cxlkv may "
          "have written it; to reset the region stop every LMCache server mapping it and "
          "delete the keys under ",
          gens_.substr(0, gens_.size() - 4)));
    }
    return h;
  }

  void NoteLive(const std::string& gen) {
    live_ = gen;
    std::int64_t e = 0;
    std::uint64_t n = 0;
    if (ParseGeneration(gen, &e, &n) && e == epoch_) count_ = std::max(count_, n);
  }

  // One read of the state; *moved when the head changed while it was read (read again).
  absl::StatusOr<std::optional<Loaded>> LoadOnce(bool* moved) {
    // The single value, when there, is the state: every flip deletes it, so it was written
    // after the head's generation (an earlier cxlkv led since), or there is no head at all.
    auto legacy = client_->Get(legacy_);
    if (!legacy.ok()) return Named(legacy.status(), legacy_, "read");
    if (!legacy->kvs.empty()) return LoadLegacy(legacy->kvs[0].value);
    auto head = client_->Get(head_);
    if (!head.ok()) return Named(head.status(), head_, "read");
    if (head->kvs.empty()) {
      live_known_ = true;  // none: a new region
      return std::optional<Loaded>();
    }
    const std::int64_t head_rev = head->kvs[0].mod_revision;
    auto h = ParseHead(head->kvs[0].value);
    if (!h.ok()) return h.status();
    auto head_moved = [&]() -> absl::StatusOr<bool> {
      auto again = client_->Get(head_);
      if (!again.ok()) return Named(again.status(), head_, "read");
      return again->kvs.empty() || again->kvs[0].mod_revision != head_rev;
    };
    Loaded out;
    const std::string prefix = gens_ + h->generation + "/";
    for (std::uint64_t i = 0; i < h->chunks; ++i) {
      const std::string key = ChunkKey(prefix, i);
      auto chunk = client_->Get(key);
      if (!chunk.ok()) return Named(chunk.status(), key, "read");
      if (chunk->kvs.empty()) {
        auto m = head_moved();
        if (!m.ok()) return m.status();
        if (*m) {
          *moved = true;
          return absl::AbortedError(absl::StrCat(head_, ": changed while it was read"));
        }
        return absl::DataLossError(absl::StrCat(
            key, ": missing, and ", head_, " names ", h->chunks, " chunks of generation ",
            h->generation,
            "; the coordinator will not start on it (nothing is discarded). Restore etcd from a "
            "backup, or, to reset the region, stop every LMCache server mapping it and delete "
            "the keys under ",
            gens_.substr(0, gens_.size() - 4)));
      }
      out.snapshot += chunk->kvs[0].value;
    }
    if (out.snapshot.size() != h->bytes || Crc(out.snapshot) != h->crc32c) {
      return absl::DataLossError(absl::StrCat(
          gens_, h->generation, "/: the chunks hold ", out.snapshot.size(), " bytes of CRC32C ",
          Crc(out.snapshot), ", and ", head_, " says ", h->bytes, " bytes of ", h->crc32c,
          "; the coordinator will not start on it (nothing is discarded). Restore etcd from a "
          "backup, or, to reset the region, stop every LMCache server mapping it and delete the "
          "keys under ",
          gens_.substr(0, gens_.size() - 4)));
    }
    // The records after the snapshot, a window at a time (each reply stays small); they are
    // numbered without gaps from journal_seq + 1.
    for (std::uint64_t from = h->journal_seq + 1;; from += journal_window_) {
      auto records = client_->Get(RecordKey(from), RecordKey(from + journal_window_));
      if (!records.ok()) return Named(records.status(), journal_, "read");
      for (const ed::KeyValue& kv : records->kvs) out.journal += kv.value;  // in seq order
      if (records->kvs.size() < journal_window_) break;
    }
    auto m = head_moved();
    if (!m.ok()) return m.status();
    if (*m) {
      *moved = true;
      return absl::AbortedError(absl::StrCat(head_, ": changed while it was read"));
    }
    NoteLive(h->generation);
    live_known_ = true;
    return std::optional<Loaded>(std::move(out));
  }

  // The single-value form an earlier cxlkv writes: the snapshot and every record.
  absl::StatusOr<std::optional<Loaded>> LoadLegacy(const std::string& snapshot) {
    Loaded out;
    out.snapshot = snapshot;
    auto records = client_->Get(journal_, ed::PrefixEnd(journal_));
    if (!records.ok()) return Named(records.status(), journal_, "read");
    for (const ed::KeyValue& kv : records->kvs) out.journal += kv.value;  // in key (seq) order
    return std::optional<Loaded>(std::move(out));
  }

  std::string RecordKey(std::uint64_t seq) const {
    return absl::StrFormat("%s%020u", journal_, seq);
  }
  static std::string ChunkKey(const std::string& prefix, std::uint64_t i) {
    return absl::StrFormat("%s%010u", prefix, i);
  }

  static absl::Status Named(const absl::Status& st, const std::string& key, const char* what) {
    return absl::Status(st.code(), absl::StrCat(key, ": cannot ", what, ": ", st.message()));
  }

  absl::Status Guarded(const std::vector<ed::Op>& ops, const std::string& key) {
    using C = ed::Compare;
    auto r = client_->Txn({C::CreateRevision(leader_, C::Result::kEqual, epoch_)}, ops, {});
    if (!r.ok()) return Named(r.status(), key, "write");
    if (!r->succeeded) {
      return absl::AbortedError(absl::StrCat(key,
                                             ": not written: this orchestrator no longer leads "
                                             "the domain (epoch ",
                                             epoch_, ")"));
    }
    return absl::OkStatus();
  }

  std::unique_ptr<ed::Client> client_;
  std::string leader_, head_, gens_, legacy_, journal_;
  std::int64_t epoch_;
  std::uint64_t chunk_bytes_;
  std::uint64_t journal_window_;  // records read per request
  std::function<void()> before_flip_;
  std::string live_;         // the generation the head names, as last read or written
  bool live_known_ = false;  // live_ is etcd's (a Load or a flip happened)
  std::uint64_t count_ = 0;  // generations this epoch has named
};

}  // namespace

absl::StatusOr<std::unique_ptr<StateStore>> EtcdStateStore(const EtcdPlace& place,
                                                           std::int64_t epoch) {
  ed::ClientOptions o = place.client;
  o.attempt_timeout_ms = std::min<std::uint32_t>(o.attempt_timeout_ms, o.call_timeout_ms);
  auto client = ed::Client::Create(o);
  if (!client.ok()) return client.status();
  return std::unique_ptr<StateStore>(new EtcdStore(*std::move(client), place, epoch));
}

}  // namespace cxlkv::coordinator
