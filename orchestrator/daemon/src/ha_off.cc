// HaSession in a build without the etcd client (CXLKV_WITH_ETCD=OFF, or etcd's protos were
// missing at configure time): an [etcd] section is refused with the way to get HA.
#include "absl/strings/str_cat.h"
#include "ha.h"

namespace cxlkv::orchestrator {

absl::StatusOr<std::unique_ptr<HaSession>> HaSession::Create(const Config& c, const std::string&,
                                                             coherence::Clock*) {
  return absl::FailedPreconditionError(absl::StrCat(
      "domain '", c.name,
      "': the config has an [etcd] section, but this cxlkv-orchestrator was built without the "
      "etcd client (no orchestrator HA): install golang-etcd-server-dev (scripts/deps does) "
      "and rebuild with CXLKV_WITH_ETCD=AUTO or ON, or remove the [etcd] section to run this "
      "orchestrator as the domain's only one"));
}

}  // namespace cxlkv::orchestrator
