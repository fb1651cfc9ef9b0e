// cxlkv/orchestrator/directory_client.h — asks an orchestrator which CXL domains may hold a
// prefix (the Directory RPC; docs/ha.md, "Cross-domain prefix directory"). Any orchestrator
// that runs with [etcd] answers, leader or standby, of any domain: the directory covers every
// domain of the etcd cluster. This is how the C API (cxlkv_directory_where) and so the Python
// package read the directory without an etcd client in the serving process.
//
// `where` is one endpoint or several separated by commas (endpoint.h: a Unix socket path,
// unix:PATH or tcp:HOST:PORT); a call tries them in order until one answers.
//
// Errors: the orchestrator's status unchanged (kFailedPrecondition: it runs without etcd;
// kUnavailable: etcd cannot be read), or kUnavailable / kDeadlineExceeded when none answers.
// Thread-safety: calls may be made from several threads at once.
#ifndef CXLKV_ORCHESTRATOR_DIRECTORY_CLIENT_H_
#define CXLKV_ORCHESTRATOR_DIRECTORY_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cxlkv/coherence/key.h"

namespace cxlkv::orchestrator {

struct DomainVerdict {
  std::string domain;
  bool may_hold = false;
  bool anchor = true;  // false: not an anchor under that domain's anchor_every (ask deeper)
  std::uint64_t published = 0;
  double fp_rate = 0;
  std::int64_t epoch = 0;
  std::int64_t age_ms = 0;
  std::uint64_t filter_bytes = 0;
  bool keyed = false;    // the domain keys its published keys (docs/kv_events.md)
  bool key_held = true;  // keyed: the answerer holds the secret (else may_hold says nothing)
};

struct WhereResult {
  std::vector<DomainVerdict> domains;  // every domain with a summary, in name order
  std::int64_t revision = 0;
};

class DirectoryClient {
 public:
  static absl::StatusOr<std::unique_ptr<DirectoryClient>> Connect(
      const std::string& where, std::chrono::milliseconds deadline = std::chrono::seconds(5));
  ~DirectoryClient();
  DirectoryClient(const DirectoryClient&) = delete;
  DirectoryClient& operator=(const DirectoryClient&) = delete;

  absl::StatusOr<WhereResult> Where(const coherence::PrefixKey& key);

 private:
  struct Rpc;
  explicit DirectoryClient(std::vector<std::unique_ptr<Rpc>> rpcs);
  std::vector<std::unique_ptr<Rpc>> rpcs_;
};

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_DIRECTORY_CLIENT_H_
