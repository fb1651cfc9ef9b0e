// cxlkv/orchestrator/endpoint.h — where a client reaches the orchestrator's control plane.
//
//   /run/cxlkv/D.sock or unix:/run/cxlkv/D.sock   the Unix socket (peer credentials checked)
//   tcp:HOST:PORT                                  TCP: every call carries the domain's token
//                                                  (read from the file CXLKV_RPC_TOKEN_FILE
//                                                  names); TLS when CXLKV_RPC_CA names the PEM
//                                                  of the CA that signed the orchestrator's
//                                                  certificate (rpc.tls_cert)
// Errors name the variable or file and the fix.
#ifndef CXLKV_ORCHESTRATOR_ENDPOINT_H_
#define CXLKV_ORCHESTRATOR_ENDPOINT_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cxlkv/orchestrator/token.h"

namespace cxlkv::orchestrator {

struct Endpoint {
  std::string target;  // gRPC target: unix:PATH or HOST:PORT
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string token;  // TCP: sent as "authorization: Bearer <token>"
  std::string Describe() const;
  // Adds the token (if any) to a call.
  void Authorize(grpc::ClientContext* ctx) const;
};

absl::StatusOr<Endpoint> ResolveEndpoint(const std::string& where);

// etcd's credentials for a process that reads etcd itself (a host's etcd:// discovery,
// `cxlkvctl where --etcd`): CXLKV_ETCD_USER with CXLKV_ETCD_PASSWORD_FILE (the password,
// trailing white space dropped), CXLKV_ETCD_CA (the PEM of the CA that signs the members'
// certificates). Unset: empty (no authentication, plaintext). An error names the variable.
struct EtcdEnvCredentials {
  std::string user, password, ca_pem;
};
absl::StatusOr<EtcdEnvCredentials> EtcdCredentialsFromEnv();

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_ENDPOINT_H_
