// cxlkv/orchestrator/directory_reader.h — reads every domain's summary (directory.h) from
// etcd and answers which domains may hold a prefix.
//
// Open() reads /cxlkv/v1/<cluster>/directory/ with one range read; with `follow` a thread then
// watches that prefix from the revision read and applies every change, so Where() answers
// from memory (no etcd round trip) and a domain whose leader's lease ended drops out as soon
// as etcd deletes its key. When the watch breaks (a member died) or its start was compacted
// away, the thread reads the range afresh and watches from there. Without `follow`, Refresh()
// re-reads on demand (what a one-shot tool does).
//
// Where() reports, per domain: may_hold (the key is an anchor there and its filter has it;
// false positives at about fp_rate, never a false negative for a key the summary was built
// with), whether the key is an anchor under that domain's anchor_every (when not, may_hold is
// false and the caller should ask with the deepest anchor of its chain), the published count,
// the filter's false-positive rate at that count, and the summary's age.
//
// Keyed summaries (published_key.h): a domain that keys its published chain keys with a secret
// writes a summary of K' under that secret's id. Where() computes K' from the caller's chain
// key with each secret in ReaderOptions::publish_secrets whose id matches and asks the filter;
// for a keyed summary whose secret the reader lacks, the answer is keyed, key_held = false and
// may_hold = false (the reader cannot tell), never a guess.
//
// Errors: Open fails with etcd's status naming the endpoint (kUnavailable, kDeadlineExceeded);
// an etcd with authentication enabled refuses a reader without `user` (etcd's "user name is
// empty", with the options to set appended).
// A summary that does not decode is skipped and counted (bad_summaries()).
//
// Thread-safety: every method may be called from any thread.
#ifndef CXLKV_ORCHESTRATOR_DIRECTORY_READER_H_
#define CXLKV_ORCHESTRATOR_DIRECTORY_READER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cxlkv/orchestrator/directory.h"
#include "cxlkv/orchestrator/etcd.h"
#include "cxlkv/orchestrator/published_key.h"

namespace cxlkv::orchestrator::directory {

struct ReaderOptions {
  // The etcd client's: the members (host:port), the call timeout, authentication and TLS (the
  // daemon makes them from its [etcd] section, as for its other etcd clients; cxlkvctl from
  // --etcd, CXLKV_ETCD_USER, CXLKV_ETCD_PASSWORD_FILE and CXLKV_ETCD_CA). One attempt on one
  // member is bounded by half the call timeout (at least 100 ms), whatever attempt_timeout_ms
  // says.
  etcd::ClientOptions client;
  std::string cluster = "default";
  bool follow = true;  // keep the cache current with a watch
  // The publish secrets of the domains whose keyed summaries this reader may match (each at
  // least kMinPublishSecret bytes; Open refuses a shorter one, naming its position).
  std::vector<std::string> publish_secrets;
};

class DirectoryReader {
 public:
  static absl::StatusOr<std::unique_ptr<DirectoryReader>> Open(const ReaderOptions& o);
  ~DirectoryReader();
  DirectoryReader(const DirectoryReader&) = delete;
  DirectoryReader& operator=(const DirectoryReader&) = delete;

  // Every domain with a summary, in name order.
  std::vector<DomainAnswer> Where(const coherence::PrefixKey& key) const;
  // Only the domains that may hold the key.
  std::vector<std::string> DomainsThatMayHold(const coherence::PrefixKey& key) const;
  // Reads the range again now (also what the watch thread does after a break).
  absl::Status Refresh();
  // Domains known now.
  std::vector<std::string> Domains() const;
  std::int64_t revision() const;
  std::uint64_t bad_summaries() const { return bad_.load(); }

 private:
  explicit DirectoryReader(const ReaderOptions& o, std::unique_ptr<etcd::Client> c);
  void Apply(const etcd::KeyValue& kv) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WatchLoop();

  ReaderOptions o_;
  std::unique_ptr<etcd::Client> client_;
  std::string prefix_;
  std::vector<PublishedKeyer> keyers_;
  mutable absl::Mutex mu_;
  std::map<std::string, Summary> by_key_ ABSL_GUARDED_BY(mu_);
  std::int64_t revision_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<std::uint64_t> bad_{0};
  std::atomic<bool> stop_{false};
  std::thread watcher_;
};

}  // namespace cxlkv::orchestrator::directory

#endif  // CXLKV_ORCHESTRATOR_DIRECTORY_READER_H_
