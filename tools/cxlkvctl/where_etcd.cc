// cxlkvctl where --etcd: the directory read straight from etcd (DirectoryReader, no watch).
#include "absl/strings/str_split.h"
#include "cxlkv/orchestrator/directory_reader.h"
#include "where.h"

namespace cxlkv::ctl {

absl::StatusOr<orchestrator::WhereResult> WhereViaEtcd(const std::string& endpoints,
                                                       const std::string& cluster,
                                                       const std::vector<std::string>& secrets,
                                                       const coherence::PrefixKey& key) {
  namespace dir = ::cxlkv::orchestrator::directory;
  dir::ReaderOptions ro;
  ro.endpoints = absl::StrSplit(endpoints, ',', absl::SkipWhitespace());
  ro.cluster = cluster;
  ro.follow = false;
  ro.publish_secrets = secrets;
  auto reader = dir::DirectoryReader::Open(ro);
  if (!reader.ok()) return reader.status();
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
