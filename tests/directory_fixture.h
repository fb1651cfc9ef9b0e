// The fixture of the tests that run orchestrators with the cross-domain directory (docs/ha.md)
// as child processes (orchestrator_process.h): a fresh 3-member etcd cluster for each test
// (etcd_cluster.h), the [etcd] and [directory] sections that make an orchestrator join it, and
// a reader's answer for one key. Skipped without etcd.
#ifndef CXLKV_TESTS_DIRECTORY_FIXTURE_H_
#define CXLKV_TESTS_DIRECTORY_FIXTURE_H_

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/orchestrator/directory_reader.h"
#include "etcd_cluster.h"

namespace cxlkv::testing {

class EtcdDirectoryTest : public EtcdClusterTest {
 protected:
  // TOML for SmallDomain's `extra`: this cluster, a session TTL of 2 s, summaries rewritten
  // at most every 100 ms and at least every 5 s.
  std::string Extra() const {
    return absl::StrCat("[etcd]\nendpoints = ", etcd_->EndpointsToml(), "\nttl_s = 2\n",
                        "[directory]\nmin_interval_ms = 100\nrefresh_ms = 5000\n");
  }
};

// The domains whose summary may hold `k`, as `r` sees them now.
inline std::vector<std::string> MayHold(const orchestrator::directory::DirectoryReader& r,
                                        const coherence::PrefixKey& k) {
  return r.DomainsThatMayHold(k);
}

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_DIRECTORY_FIXTURE_H_
