// A build without the etcd client: no [etcd] domain starts (the daemon refuses the section),
// so nothing asks for the coordinator's state in etcd.
#include "cxlkv/coordinator/service.h"

namespace cxlkv::coordinator {

absl::StatusOr<std::unique_ptr<StateStore>> EtcdStateStore(const EtcdPlace& /*place*/,
                                                           std::int64_t /*epoch*/) {
  return absl::FailedPreconditionError(
      "this build has no etcd client (CXLKV_WITH_ETCD): the coordinator's state cannot be kept "
      "in etcd");
}

}  // namespace cxlkv::coordinator
