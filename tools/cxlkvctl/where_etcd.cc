// cxlkvctl where --etcd: the directory read straight from etcd (DirectoryReader, no watch).
// etcd's authentication and TLS come from the environment, as for a host's etcd:// discovery
// (docs/ha.md): CXLKV_ETCD_USER with CXLKV_ETCD_PASSWORD_FILE, CXLKV_ETCD_CA.
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cxlkv/orchestrator/directory_reader.h"
#include "cxlkv/orchestrator/endpoint.h"
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
  auto creds = orchestrator::EtcdCredentialsFromEnv();
  if (!creds.ok()) return creds.status();
  ro.client.user = creds->user;
  ro.client.password = creds->password;
  ro.client.ca_pem = creds->ca_pem;
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
