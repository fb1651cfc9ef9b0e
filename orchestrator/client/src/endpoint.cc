// Endpoint: Unix socket or TCP with a token (and optionally TLS).
#include "cxlkv/orchestrator/endpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cxlkv::orchestrator {

std::string Endpoint::Describe() const {
  if (absl::StartsWith(target, "unix:")) return target;
  return absl::StrCat("tcp:", target);
}

void Endpoint::Authorize(grpc::ClientContext* ctx) const {
  if (!token.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", token));
}

absl::StatusOr<Endpoint> ResolveEndpoint(const std::string& where) {
  Endpoint e;
  if (!absl::StartsWith(where, "tcp:")) {
    e.target = absl::StartsWith(where, "unix:") ? where : absl::StrCat("unix:", where);
    e.credentials = grpc::InsecureChannelCredentials();  // peer credentials decide
    return e;
  }
  e.target = where.substr(4);
  if (e.target.empty() || e.target.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", where, "': give tcp:HOST:PORT, e.g. tcp:10.0.0.5:7443"));
  }
  const char* token_file = std::getenv("CXLKV_RPC_TOKEN_FILE");
  if (token_file == nullptr || *token_file == '\0') {
    return absl::InvalidArgumentError(
        absl::StrCat("'", where,
                     "': the orchestrator's TCP endpoint needs the domain's token; set "
                     "CXLKV_RPC_TOKEN_FILE to the file holding it (the daemon's rpc.token_file)"));
  }
  auto token = ReadTokenFile(token_file, "CXLKV_RPC_TOKEN_FILE");
  if (!token.ok()) return token.status();
  e.token = *std::move(token);
  const char* ca = std::getenv("CXLKV_RPC_CA");
  if (ca != nullptr && *ca != '\0') {
    auto pem = ReadSmallFile(ca, "CXLKV_RPC_CA");
    if (!pem.ok()) return pem.status();
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = *std::move(pem);
    e.credentials = grpc::SslCredentials(o);
  } else {
    e.credentials = grpc::InsecureChannelCredentials();
  }
  return e;
}

absl::StatusOr<EtcdEnvCredentials> EtcdCredentialsFromEnv() {
  EtcdEnvCredentials c;
  if (const char* ca = std::getenv("CXLKV_ETCD_CA"); ca != nullptr && *ca != '\0') {
    auto pem = ReadSmallFile(ca, "CXLKV_ETCD_CA");
    if (!pem.ok()) return pem.status();
    c.ca_pem = *std::move(pem);
  }
  if (const char* user = std::getenv("CXLKV_ETCD_USER"); user != nullptr && *user != '\0') {
    const char* pw = std::getenv("CXLKV_ETCD_PASSWORD_FILE");
    if (pw == nullptr || *pw == '\0') {
      return absl::InvalidArgumentError(
          "CXLKV_ETCD_USER is set but CXLKV_ETCD_PASSWORD_FILE is not: set it to the file "
          "holding that etcd user's password");
    }
    auto password = ReadSmallFile(pw, "CXLKV_ETCD_PASSWORD_FILE");
    if (!password.ok()) return password.status();
    c.user = user;
    c.password = std::string(absl::StripTrailingAsciiWhitespace(*password));
  }
  return c;
}

}  // namespace cxlkv::orchestrator
