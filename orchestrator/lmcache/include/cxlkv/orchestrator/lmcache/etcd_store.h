// cxlkv/orchestrator/lmcache/etcd_store.h — the coordinator's state in etcd, for a domain with
// [etcd] (docs/lmcache.md "Fail-over", "The state in etcd"). Only in a build with the etcd
// client (cxlkv::etcd): without it no domain has [etcd], and the daemon's HA session
// (ha_etcd.cc), its one caller, is not built.
#ifndef CXLKV_ORCHESTRATOR_LMCACHE_ETCD_STORE_H_
#define CXLKV_ORCHESTRATOR_LMCACHE_ETCD_STORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cxlkv/orchestrator/etcd.h"
#include "cxlkv/orchestrator/lmcache/coordinator.h"

namespace cxlkv::coordinator {

// Where a domain with [etcd] keeps the coordinator's state: <domain_key>/lmcache/ (head,
// gen/<generation>/<chunk>, journal/<seq>), beside the daemon's <domain_key>/leader and /state
// (docs/ha.md "Keys", docs/lmcache.md "The state in etcd").
struct EtcdPlace {
  // The etcd client's: endpoints, call timeout, authentication and TLS, as the daemon makes
  // them from its [etcd] section for every etcd client it has (EtcdClientOptions). One attempt
  // on one member is bounded by the call timeout too.
  orchestrator::etcd::ClientOptions client;
  std::string domain_key;  // "/cxlkv/v1/<cluster>/domains/<domain>"
  // The snapshot is written in chunks of at most this many bytes, one etcd request each;
  // halved (down to 1 KiB) each time etcd refuses one as too large (its --max-request-bytes,
  // 1.5 MiB by default), and kept so for the store's life.
  std::uint32_t snapshot_chunk_bytes = 1u << 20;
  // Journal records read per request when loading (each reply stays small).
  std::uint32_t journal_read_batch = 1000;
  // Tests: called once a new generation's chunks are all written, before the flip.
  std::function<void()> before_flip;
};

// The coordinator's state in etcd for the leader of `epoch` (the leader key's create
// revision): every write is a transaction that holds only while that leader key is there.
absl::StatusOr<std::unique_ptr<StateStore>> EtcdStateStore(const EtcdPlace& place,
                                                           std::int64_t epoch);

}  // namespace cxlkv::coordinator

#endif  // CXLKV_ORCHESTRATOR_LMCACHE_ETCD_STORE_H_
