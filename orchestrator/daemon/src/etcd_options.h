// The etcd client's options from domain.toml's [etcd] section (private to the daemon; built
// only with the etcd client): one place for the section's endpoints, call timeout,
// authentication and TLS, which every etcd client the daemon makes starts from (the HA
// session's, the LMCache coordinator's store, the Directory RPC's reader). How long one
// attempt on one member may take stays each client's own choice.
#ifndef CXLKV_ORCHESTRATOR_DAEMON_SRC_ETCD_OPTIONS_H_
#define CXLKV_ORCHESTRATOR_DAEMON_SRC_ETCD_OPTIONS_H_

#include "cxlkv/orchestrator/config.h"
#include "cxlkv/orchestrator/etcd.h"

namespace cxlkv::orchestrator {

// `e` as loaded (LoadConfig read the password and PEM files into it).
etcd::ClientOptions EtcdClientOptions(const EtcdConfig& e);

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_DAEMON_SRC_ETCD_OPTIONS_H_
