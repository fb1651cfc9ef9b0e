// cxlkvctl where's read of etcd (where_etcd.cc; where_etcd_off.cc in a build without the etcd
// client, which refuses naming the other way in).
#ifndef CXLKV_TOOLS_CXLKVCTL_WHERE_H_
#define CXLKV_TOOLS_CXLKVCTL_WHERE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cxlkv/coherence/key.h"
#include "cxlkv/orchestrator/directory_client.h"

namespace cxlkv::ctl {

// One range read of the directory of `cluster` at the etcd members `endpoints` (comma-separated
// host:port), answered for `key`.
absl::StatusOr<orchestrator::WhereResult> WhereViaEtcd(const std::string& endpoints,
                                                       const std::string& cluster,
                                                       const std::vector<std::string>& secrets,
                                                       const coherence::PrefixKey& key);

}  // namespace cxlkv::ctl

#endif  // CXLKV_TOOLS_CXLKVCTL_WHERE_H_
