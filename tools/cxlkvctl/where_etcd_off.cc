// cxlkvctl where --etcd in a build without the etcd client: refused, naming --socket.
#include "absl/strings/str_cat.h"
#include "where.h"

namespace cxlkv::ctl {

absl::StatusOr<orchestrator::WhereResult> WhereViaEtcd(const std::string& endpoints,
                                                       const std::string&,
                                                       const std::vector<std::string>&,
                                                       const coherence::PrefixKey&) {
  return absl::FailedPreconditionError(absl::StrCat(
      "this cxlkvctl was built without the etcd client (golang-etcd-server-dev was missing); "
      "ask an orchestrator that runs with [etcd] with --socket instead of --etcd ",
      endpoints));
}

}  // namespace cxlkv::ctl
