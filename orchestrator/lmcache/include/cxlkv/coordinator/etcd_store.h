// cxlkv/coordinator/etcd_store.h — the coordinator's state in etcd, for a domain with [etcd]
// (docs/lmcache.md "Fail-over"): <domain_key>/lmcache/ (snapshot, journal/<seq>), beside the
// daemon's <domain_key>/leader and /state (docs/ha.md "Keys"). Only in a build with the etcd
// client (cxlkv::etcd); the daemon's HA session (ha_etcd.cc) is its one caller.
#ifndef CXLKV_COORDINATOR_ETCD_STORE_H_
#define CXLKV_COORDINATOR_ETCD_STORE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cxlkv/coordinator/coordinator.h"
#include "cxlkv/orchestrator/etcd.h"

namespace cxlkv::coordinator {

// The store for the leader of `epoch` (the leader key's create revision): every write is a
// transaction that holds only while that leader key is there. `options` are the [etcd]
// section's (endpoints, authentication, TLS, call timeout), as the daemon makes them for its
// own client; one attempt on one endpoint is bounded by the call timeout as well.
// `domain_key`: "/cxlkv/v1/<cluster>/domains/<domain>".
absl::StatusOr<std::unique_ptr<StateStore>> EtcdStateStore(
    const orchestrator::etcd::ClientOptions& options, const std::string& domain_key,
    std::int64_t epoch);

}  // namespace cxlkv::coordinator

#endif  // CXLKV_COORDINATOR_ETCD_STORE_H_
