// The Directory RPC (orchestrator/proto/directory.proto; private to the daemon): which domains
// may hold a prefix, answered by any orchestrator with [etcd] — leader or standby — from a
// DirectoryReader that follows every domain's summary in etcd. The reader is opened at the
// first call (and again after a failed open), so an etcd outage at start delays only this
// call. Without [etcd] (or in a build without the etcd client) every call fails with
// FAILED_PRECONDITION saying why. Peers are admitted as for the main service: the Unix socket's
// accept loop checked the uid; a TCP peer must carry the token.
#ifndef CXLKV_ORCHESTRATOR_DAEMON_SRC_DIRECTORY_SERVICE_H_
#define CXLKV_ORCHESTRATOR_DAEMON_SRC_DIRECTORY_SERVICE_H_

#include <functional>
#include <memory>
#include <string>

#include "cxlkv/orchestrator/config.h"

namespace grpc {
class Service;
}

namespace cxlkv::orchestrator {

// `own_secret`: the secret this domain's keys leave under now (DomainCore::PublishSecret; ""
// while it has none), so that the Directory RPC answers for its own keyed domain.
std::unique_ptr<grpc::Service> MakeDirectoryService(const Config& c,
                                                    std::function<std::string()> own_secret);

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_DAEMON_SRC_DIRECTORY_SERVICE_H_
