// The namespace names the HA tests' harness and tests use (tests/ha/).
#ifndef CXLKV_TESTS_HA_NAMESPACES_H_
#define CXLKV_TESTS_HA_NAMESPACES_H_

#include <chrono>

namespace cxlkv::coherence {}
namespace cxlkv::orchestrator::v1 {}

namespace cxlkv::testing {

namespace pb = ::cxlkv::orchestrator::v1;
namespace co = ::cxlkv::coherence;
namespace orch = ::cxlkv::orchestrator;
using std::chrono::milliseconds;

}  // namespace cxlkv::testing

#endif  // CXLKV_TESTS_HA_NAMESPACES_H_
