// The daemon's gRPC service (orchestrator/proto/orchestrator.proto; private to the daemon):
// hosts' membership, heartbeats and capacity leases, and the operator's queries, answered from
// the Orchestrator's state under its mutex. Whether a call may change the domain (a leader, a
// standby, read-only) is the Orchestrator's to say (ServingLocked, ReadableLocked); the
// service asks it on every call. Peers: a Unix-socket peer was admitted by the accept loop,
// which checked its uid; a TCP peer must carry the token (rpc.token_file).
#ifndef CXLKV_ORCHESTRATOR_DAEMON_SRC_SERVICE_H_
#define CXLKV_ORCHESTRATOR_DAEMON_SRC_SERVICE_H_

#include <memory>

#include "cxlkv/orchestrator/daemon.h"

namespace grpc {
class Service;
}

namespace cxlkv::orchestrator {

// The service of `o`, which must outlive it.
std::unique_ptr<grpc::Service> MakeOrchestratorService(Orchestrator& o);

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_DAEMON_SRC_SERVICE_H_
