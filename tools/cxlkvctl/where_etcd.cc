// cxlkvctl where --etcd: the directory read straight from etcd (DirectoryReader, no watch).
// etcd's authentication and TLS come from the environment, as for a host's etcd:// discovery
// (docs/ha.md): CXLKV_ETCD_USER with CXLKV_ETCD_PASSWORD_FILE, CXLKV_ETCD_CA.
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cxlkv/orchestrator/directory_reader.h"
#include "cxlkv/orchestrator/token.h"
#include "where.h"

namespace cxlkv::ctl {

absl::StatusOr<orchestrator::WhereResult> WhereViaEtcd(const std::string& endpoints,
                                                       const std::string& cluster,
                                                       const std::vector<std::string>& secrets,
                                                       const coherence::PrefixKey& key) {
  namespace dir = ::cxlkv::orchestrator::directory;
  dir::ReaderOptions ro;
  ro.client.endpoints = absl::StrSplit(endpoints, ',', absl::SkipWhitespace());
  ro.cluster = cluster;
  ro.follow = false;
  ro.publish_secrets = secrets;
  if (const char* ca = std::getenv("CXLKV_ETCD_CA"); ca != nullptr && *ca != '\0') {
    auto pem = orchestrator::ReadSmallFile(ca, "CXLKV_ETCD_CA");
    if (!pem.ok()) return pem.status();
    ro.client.ca_pem = *std::move(pem);
  }
  if (const char* user = std::getenv("CXLKV_ETCD_USER"); user != nullptr && *user != '\0') {
    const char* pw = std::getenv("CXLKV_ETCD_PASSWORD_FILE");
    if (pw == nullptr || *pw == '\0') {
      return absl::InvalidArgumentError(
          "CXLKV_ETCD_USER is set but CXLKV_ETCD_PASSWORD_FILE is not: set it to the file "
          "holding that etcd user's password");
    }
    auto password = orchestrator::ReadSmallFile(pw, "CXLKV_ETCD_PASSWORD_FILE");
    if (!password.ok()) return password.status();
    ro.client.user = user;
    ro.client.password = std::string(absl::StripTrailingAsciiWhitespace(*password));
  }
  auto reader = dir::DirectoryReader::Open(ro);
  if (!reader.ok()) {
    if (ro.client.user.empty() &&
        absl::StrContains(reader.status().message(), "user name is empty")) {
      return absl::Status(reader.status().code(),
                          absl::StrCat(reader.status().message(),
                                       "; set CXLKV_ETCD_USER and CXLKV_ETCD_PASSWORD_FILE"));
    }
    return reader.status();
  }
  orchestrator::WhereResult r;
  r.revision = (*reader)->revision();
  for (const dir::DomainAnswer& a : (*reader)->Where(key)) {
    r.domains.push_back(orchestrator::DomainVerdict{a.domain, a.may_hold, a.anchor, a.published,
                                                    a.fp_rate, a.epoch, a.age_ms, a.filter_bytes,
                                                    a.keyed, a.key_held});
  }
  return r;
}

}  // namespace cxlkv::ctl
