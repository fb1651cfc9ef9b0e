// cxlkv/coordinator/service.h — LMCache's memory coordinator HTTP API (docs/lmcache.md "The
// coordinator"), served by civetweb (Debian's libcivetweb, already in the orchestrator through
// prometheus-cpp) for the orchestrator of a domain with an [lmcache] section.
//
// Start opens the Coordinator (its state file), loads the tenants' tokens, binds
// lmcache.listen, and runs a reaper thread that reclaims expired reservations. The wire is
// LMCache's (routes, bodies, status codes); every body field is checked and unknown fields are
// refused (422). Rejected requests are logged to stderr naming the client and its tenant.
// Thread-safe; the destructor stops serving (in-flight requests finish first).
#ifndef CXLKV_COORDINATOR_SERVICE_H_
#define CXLKV_COORDINATOR_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "cxlkv/coordinator/config.h"
#include "cxlkv/coordinator/coordinator.h"

struct mg_context;
struct mg_connection;

namespace cxlkv::coordinator {

class Service {
 public:
  // c must be resolved (ResolveCoordinatorConfig). The region is the pool's last
  // c.region_bytes of its whole extents (HostPoolBytes); kInvalidArgument when that leaves the
  // hosts no extent. Errors name the file, key or address at fault.
  static absl::StatusOr<std::unique_ptr<Service>> Start(const CoordinatorConfig& c,
                                                        std::uint64_t pool_bytes,
                                                        std::uint64_t extent_bytes);
  ~Service();
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  int port() const { return port_; }  // the bound port (lmcache.listen may say 0)
  Coordinator& coordinator() { return *co_; }

 private:
  Service() = default;
  static int Handle(mg_connection* conn, void* self);
  int Serve(mg_connection* conn);
  static std::int64_t NowMs();

  CoordinatorConfig c_;
  std::unique_ptr<Coordinator> co_;
  std::map<std::string, std::string> tokens_;  // token -> tenant
  mg_context* ctx_ = nullptr;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread reaper_;
};

}  // namespace cxlkv::coordinator

#endif  // CXLKV_COORDINATOR_SERVICE_H_
