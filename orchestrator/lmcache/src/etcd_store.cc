// The coordinator's state in etcd, for a domain with [etcd] (docs/lmcache.md "Fail-over"):
// <domain key>/lmcache/snapshot and <domain key>/lmcache/journal/<seq, 20 digits>, written
// only by the leader of `epoch` (each write is a transaction guarded by the leader key's
// create revision, as the daemon's own state writes are).
#include "cxlkv/coordinator/etcd_store.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cxlkv::coordinator {
namespace {

namespace ed = ::cxlkv::orchestrator::etcd;

class EtcdStore : public StateStore {
 public:
  EtcdStore(std::unique_ptr<ed::Client> client, const std::string& domain_key, std::int64_t epoch)
      : client_(std::move(client)),
        leader_(domain_key + "/leader"),
        snapshot_(domain_key + "/lmcache/snapshot"),
        journal_(domain_key + "/lmcache/journal/"),
        epoch_(epoch) {}

  absl::StatusOr<std::optional<Loaded>> Load() override {
    auto snap = client_->Get(snapshot_);
    if (!snap.ok()) return Named(snap.status(), snapshot_, "read");
    if (snap->kvs.empty()) return std::optional<Loaded>();
    Loaded out;
    out.snapshot = snap->kvs[0].value;
    auto records = client_->Get(journal_, ed::PrefixEnd(journal_));
    if (!records.ok()) return Named(records.status(), journal_, "read");
    for (const ed::KeyValue& kv : records->kvs) out.journal += kv.value;  // in key (seq) order
    return std::optional<Loaded>(std::move(out));
  }

  absl::Status Append(std::uint64_t seq, const std::string& record) override {
    return Guarded({ed::Op::Put(RecordKey(seq), record)}, journal_);
  }

  // Every Append is durable when etcd answers it.
  absl::Status Sync() override { return absl::OkStatus(); }

  absl::Status Compact(const std::string& text, std::uint64_t /*seq*/) override {
    // Every record goes, not only those up to seq: one after it is an append whose reply was
    // lost and which the coordinator did not apply.
    return Guarded(
        {ed::Op::Put(snapshot_, text), ed::Op::Delete(journal_, ed::PrefixEnd(journal_))},
        snapshot_);
  }

  std::string where() const override { return "etcd " + snapshot_; }
  std::string journal_where() const override { return "etcd " + journal_; }

 private:
  std::string RecordKey(std::uint64_t seq) const {
    return absl::StrFormat("%s%020u", journal_, seq);
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
  std::string leader_, snapshot_, journal_;
  std::int64_t epoch_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<StateStore>> EtcdStateStore(const ed::ClientOptions& options,
                                                           const std::string& domain_key,
                                                           std::int64_t epoch) {
  ed::ClientOptions o = options;
  o.attempt_timeout_ms = std::min<std::uint32_t>(o.attempt_timeout_ms, o.call_timeout_ms);
  auto client = ed::Client::Create(o);
  if (!client.ok()) return client.status();
  return std::unique_ptr<StateStore>(new EtcdStore(*std::move(client), domain_key, epoch));
}

}  // namespace cxlkv::coordinator
