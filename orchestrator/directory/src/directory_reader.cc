#include "cxlkv/orchestrator/directory_reader.h"

#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace cxlkv::orchestrator::directory {

namespace {
std::int64_t UnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}
}  // namespace

absl::StatusOr<std::unique_ptr<DirectoryReader>> DirectoryReader::Open(const ReaderOptions& o) {
  etcd::ClientOptions co = o.client;
  co.attempt_timeout_ms = std::max<std::uint32_t>(co.call_timeout_ms / 2, 100);
  std::vector<PublishedKeyer> keyers;
  for (std::size_t i = 0; i < o.publish_secrets.size(); ++i) {
    auto k = PublishedKeyer::Create(o.publish_secrets[i]);
    if (!k.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("directory reader: publish secret #", i + 1, ": ", k.status().message()));
    }
    keyers.push_back(*std::move(k));
  }
  auto c = etcd::Client::Create(co);
  if (!c.ok()) return c.status();
  std::unique_ptr<DirectoryReader> r(new DirectoryReader(o, *std::move(c)));
  r->keyers_ = std::move(keyers);
  if (auto st = r->Refresh(); !st.ok()) {
    if (o.client.user.empty() && absl::StrContains(st.message(), "user name is empty")) {
      return absl::Status(st.code(), absl::StrCat(st.message(),
                                                  " (etcd requires authentication: give the "
                                                  "reader an etcd user and its password)"));
    }
    return st;
  }
  if (o.follow) r->watcher_ = std::thread([p = r.get()] { p->WatchLoop(); });
  return r;
}

DirectoryReader::DirectoryReader(const ReaderOptions& o, std::unique_ptr<etcd::Client> c)
    : o_(o), client_(std::move(c)), prefix_(DirectoryPrefix(o.cluster)) {}

DirectoryReader::~DirectoryReader() {
  stop_.store(true);
  if (watcher_.joinable()) watcher_.join();
}

void DirectoryReader::Apply(const etcd::KeyValue& kv) {
  auto s = DecodeSummary(kv.value);
  if (!s.ok()) {
    bad_.fetch_add(1);
    by_key_.erase(kv.key);
    return;
  }
  by_key_[kv.key] = *std::move(s);
}

absl::Status DirectoryReader::Refresh() {
  auto r = client_->Get(prefix_, etcd::PrefixEnd(prefix_));
  if (!r.ok()) return r.status();
  absl::MutexLock l(&mu_);
  by_key_.clear();
  for (const etcd::KeyValue& kv : r->kvs) Apply(kv);
  revision_ = r->header.revision;
  return absl::OkStatus();
}

void DirectoryReader::WatchLoop() {
  while (!stop_.load()) {
    std::int64_t from = 0;
    {
      absl::MutexLock l(&mu_);
      from = revision_ + 1;
    }
    auto w = client_->NewWatch(prefix_, etcd::PrefixEnd(prefix_), from);
    if (!w.ok()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      (void)Refresh();
      continue;
    }
    while (!stop_.load()) {
      auto ev = (*w)->Next(std::chrono::milliseconds(200));
      if (!ev.ok()) break;  // broken or compacted: read afresh below
      absl::MutexLock l(&mu_);
      for (const etcd::Event& e : *ev) {
        if (e.type == etcd::Event::Type::kDelete) {
          by_key_.erase(e.kv.key);
        } else {
          Apply(e.kv);
        }
        revision_ = std::max(revision_, e.kv.mod_revision);
      }
    }
    if (stop_.load()) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    (void)Refresh();
  }
}

std::vector<DomainAnswer> DirectoryReader::Where(const coherence::PrefixKey& key) const {
  const std::int64_t now = UnixMs();
  std::vector<DomainAnswer> out;
  absl::MutexLock l(&mu_);
  out.reserve(by_key_.size());
  for (const auto& [k, s] : by_key_) out.push_back(AnswerFor(s, key, keyers_, now));
  return out;
}

std::vector<std::string> DirectoryReader::DomainsThatMayHold(
    const coherence::PrefixKey& key) const {
  std::vector<std::string> out;
  for (DomainAnswer& a : Where(key)) {
    if (a.may_hold) out.push_back(std::move(a.domain));
  }
  return out;
}

std::vector<std::string> DirectoryReader::Domains() const {
  std::vector<std::string> out;
  absl::MutexLock l(&mu_);
  for (const auto& [k, s] : by_key_) out.push_back(s.domain);
  return out;
}

std::int64_t DirectoryReader::revision() const {
  absl::MutexLock l(&mu_);
  return revision_;
}

}  // namespace cxlkv::orchestrator::directory
