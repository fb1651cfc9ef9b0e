// cxlkv/orchestrator/lmcache/service.h — LMCache's memory coordinator HTTP API
// (docs/lmcache.md "The coordinator"), served by civetweb (Debian's libcivetweb, already in the
// orchestrator through prometheus-cpp) for the orchestrator of a domain with an [lmcache]
// section.
//
// Start opens the Coordinator (its state file), loads the tenants' tokens, binds
// lmcache.listen, and runs a reaper thread that reclaims expired reservations. The wire is
// LMCache's (routes, bodies, status codes); every body field is checked and unknown fields are
// refused (422). Rejected requests are logged to stderr naming the client and its tenant.
// Thread-safe; the destructor stops serving (in-flight requests finish first).
//
// Requests are served on civetweb's worker threads, whose stack is the size civetweb was built
// with (Debian's: 100 KiB): each route builds its reply in a function of its own and reads the
// body onto the heap, so the request's frames stay small.
//
// With [etcd] (docs/lmcache.md "Fail-over") every orchestrator of the domain listens, and only
// the leader serves: a Service started as a standby answers 503 on every route but /healthz
// until Lead (on election) loads the state from etcd; StandBy (on losing leadership) goes back.
#ifndef CXLKV_ORCHESTRATOR_LMCACHE_SERVICE_H_
#define CXLKV_ORCHESTRATOR_LMCACHE_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlkv/base/mutex.h"
#include "cxlkv/base/stop.h"
#include "cxlkv/orchestrator/lmcache/config.h"
#include "cxlkv/orchestrator/lmcache/coordinator.h"

struct mg_context;
struct mg_connection;

namespace cxlkv::coordinator {

// A POST body of LMCache's wire for `route` ("/v1/writes/reserve", "/v1/writes/finish",
// "/v1/writes/abort", "/v1/lookup"), read strictly (docs/lmcache.md "Rules": every field known
// and of its type, reserve, finish and abort batches of at most max_batch when it is not 0;
// lookups of any size; a key's kv_rank and object_group_id read as LMCache's models read them: "0"
// and 0.0 are 0). kInvalidArgument (the 422's detail, naming the field) otherwise. Keys and layouts
// are checked further by the Coordinator.
struct WireRequest {
  std::string region_epoch;
  std::vector<ReserveItem> items;    // reserve
  std::vector<ReservationRef> refs;  // finish, abort
  std::vector<ObjectKey> keys;       // lookup
};
absl::StatusOr<WireRequest> ParseBody(absl::string_view route, absl::string_view body,
                                      std::uint32_t max_batch);

class Service {
 public:
  // c must be resolved (ResolveCoordinatorConfig). The region is c.region_bytes at the start
  // of the pool's last whole extents that hold it (HostPoolBytes); kInvalidArgument when those
  // leave the hosts no extent. Errors name the file, key or address at fault. `standby`: serve
  // nothing until Lead (a domain with [etcd]); otherwise the state file is opened now. `own`: the
  // owner's entries in the domain's prefix index now (PrefixOwner::OwnEntries), for
  // Coordinator::AttachIndex before anything is served (unused when standing by).
  using OwnEntries = std::vector<coherence::PrefixOwner::OwnEntry>;
  static absl::StatusOr<std::unique_ptr<Service>> Start(const CoordinatorConfig& c,
                                                        std::uint64_t pool_bytes,
                                                        std::uint64_t extent_bytes, bool standby,
                                                        const OwnEntries& own);
  ~Service();
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  int port() const { return port_; }  // the bound port (lmcache.listen may say 0)

  // Elected: loads the coordinator from `store` and serves it while `may_serve` holds (the
  // leader's write deadline; checked on every request). On an error it stays a standby whose
  // 503s name the error.
  absl::Status Lead(std::unique_ptr<StateStore> store, std::function<bool()> may_serve,
                    const OwnEntries& own);
  // The owner loop's share of the index link (docs/lmcache.md "Keys in the domain's index"),
  // on the thread that drives `owner`, after its Step: carries out the coordinator's queued
  // publishes and retires, and reports the refs the index let go. Nothing while nothing is
  // served (the reclaimed refs wait in the owner for the coordinator that attaches next).
  void TendIndex(coherence::PrefixOwner& owner);
  // Leadership ended: 503 from now on, naming `why`.
  void StandBy(const std::string& why);

 private:
  Service() = default;
  static int Handle(mg_connection* conn, void* self);
  int Serve(mg_connection* conn);
  static std::int64_t NowMs();
  // The coordinator to serve now, or nullptr and why not.
  std::shared_ptr<Coordinator> Serving(std::string* why);
  void LogServing(const Coordinator& co, const std::string& from) const;

  CoordinatorConfig c_;
  std::uint64_t region_offset_ = 0;
  mutable base::Mutex mu_;
  std::shared_ptr<Coordinator> co_ ABSL_GUARDED_BY(mu_);
  std::function<bool()> may_serve_ ABSL_GUARDED_BY(mu_);
  std::string standby_why_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::string> tokens_;  // token -> tenant
  mg_context* ctx_ = nullptr;
  int port_ = 0;
  base::StopSignal stop_;             // ends the reaper's wait at once
  std::uint64_t index_refusals_ = 0;  // TendIndex's (its thread only)
  std::thread reaper_;
};

}  // namespace cxlkv::coordinator

#endif  // CXLKV_ORCHESTRATOR_LMCACHE_SERVICE_H_
