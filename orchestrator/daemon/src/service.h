// The daemon's gRPC service (orchestrator/proto/orchestrator.proto; private to the daemon):
// hosts' membership, heartbeats and capacity leases, and the operator's queries: each call,
// once its peer is let in, is one operation of the domain's core (domain_core.h), which takes
// the lock and decides whether the call may change the domain or read it (a leader, a
// standby, read-only). Peers: a Unix-socket peer was admitted by the accept loop,
// which checked its uid; a TCP peer must carry the token (rpc.token_file).
#ifndef CXLKV_ORCHESTRATOR_DAEMON_SRC_SERVICE_H_
#define CXLKV_ORCHESTRATOR_DAEMON_SRC_SERVICE_H_

#include <cstdint>
#include <memory>

namespace grpc {
class Service;
}

namespace cxlkv::orchestrator {

class DomainCore;
class Metrics;

// The service of the domain's core, which must outlive it (and `metrics`, null when off).
// `started_ms`: when the daemon started, on the core's clock (Status's uptime).
std::unique_ptr<grpc::Service> MakeOrchestratorService(DomainCore& core, Metrics* metrics,
                                                       std::int64_t started_ms);

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_DAEMON_SRC_SERVICE_H_
