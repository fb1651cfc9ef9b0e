// The pooled heap's extent source: a CXL domain's orchestrator, reached through libcxlkv.so
// loaded with dlopen() when CXLKV_POOL=orchestrator:<socket> (docs/preload.md). The shim
// itself never links gRPC/protobuf: processes that do not join a domain never load them.
//
// Thread-safety: every method may be called from any thread (one lock around the library).
#ifndef CXLKV_PRELOAD_DOMAIN_SOURCE_H_
#define CXLKV_PRELOAD_DOMAIN_SOURCE_H_

#include <pthread.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cxlkv/preload/cxl_heap.h"

namespace cxlkv::preload {

class DomainSource final : public ExtentSource {
 public:
  // Loads the library (`library`, or libcxlkv.so.0 beside the shim, then the loader's search
  // path) and looks its functions up; joins on the first Grow(). Errors name the library and
  // the fix.
  static absl::StatusOr<std::unique_ptr<DomainSource>> Load(const std::string& library,
                                                            const std::string& socket,
                                                            std::uint32_t host_id);
  ~DomainSource() override;

  absl::StatusOr<Extent> Grow(void (*revoke)(void*, std::uint32_t), void* ctx) override;
  void Shrink(std::uint32_t extent) override;
  std::string Describe() const override;
  // Leaves the domain (its extents go back to the orchestrator, which lends them again only
  // after their lease term); later Grow() calls fail.
  void Leave();

 private:
  struct Fns;
  DomainSource() = default;
  absl::Status JoinLocked();

  std::unique_ptr<Fns> fns_;
  void* handle_ = nullptr;
  std::string library_, socket_;
  std::uint32_t host_id_ = 0;
  void* domain_ = nullptr;  // cxlkv_domain*
  bool left_ = false;
  mutable pthread_mutex_t mu_ = PTHREAD_MUTEX_INITIALIZER;
};

}  // namespace cxlkv::preload

#endif  // CXLKV_PRELOAD_DOMAIN_SOURCE_H_
