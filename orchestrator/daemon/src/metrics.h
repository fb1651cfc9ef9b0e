// The daemon's Prometheus endpoint (metrics.listen; private to the daemon): the domain's
// extents, capacity and hosts, the prefix owner's entries and counters, the hosts' lookups,
// the owner step's latency and, with [etcd], the election's figures (docs/ha.md "Metrics").
// The owner loop feeds it; nothing here reads the domain on its own.
#ifndef CXLKV_ORCHESTRATOR_DAEMON_SRC_METRICS_H_
#define CXLKV_ORCHESTRATOR_DAEMON_SRC_METRICS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "cxlkv/base/stop.h"
#include "cxlkv/coherence/prefix.h"
#include "cxlkv/orchestrator/state.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace cxlkv::orchestrator {

struct HaStats;

// The message for a metrics.listen this daemon cannot listen on (Open probes it before anything
// is written; Start, which binds it for real, says the same if it was taken in between).
absl::Status MetricsListenRefused(const std::string& listen, absl::string_view why);

// Whether HOST:PORT can be bound now (SO_REUSEADDR, as the HTTP server binds it).
absl::Status ProbeListen(const std::string& listen);

class Metrics {
 public:
  // Listens on `listen` (HOST:PORT); throws what prometheus-cpp's HTTP server throws when it
  // cannot (Start turns that into MetricsListenRefused).
  explicit Metrics(const std::string& listen);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  void Update(const DomainState& s, const coherence::PrefixOwner& o, std::uint64_t extent_bytes);
  void ObserveStep(double seconds) { step_hist_.Observe(seconds); }

  // Orchestrator HA ([etcd]; docs/ha.md "Metrics"). Counters advance by what the election
  // counted since the last update; the latencies are the ones drained since then.
  struct HaView {
    bool leading = false, read_only = false;
    std::int64_t epoch = 0;
    double last_takeover_unix_s = 0, last_takeover_s = 0;
  };
  void UpdateHa(const HaStats& h, const HaView& v);
  void Traffic(std::uint64_t hits, std::uint64_t misses);

 private:
  std::string listen_;
  // Made by the destructor, destroyed after exposer_ (declared before it): the HTTP server's
  // stop then ends within milliseconds instead of its 2 s poll (base/stop.h).
  std::optional<base::ListenerWake> wake_;
  prometheus::Exposer exposer_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Gauge>& extents_;
  prometheus::Family<prometheus::Gauge>& capacity_;
  prometheus::Family<prometheus::Gauge>& hosts_;
  prometheus::Family<prometheus::Gauge>& host_used_;
  prometheus::Family<prometheus::Gauge>& host_extents_;
  // Per host and event: what a busy or stopped machine cost its leases (HostInfo::lease).
  prometheus::Family<prometheus::Gauge>& host_lease_events_;
  prometheus::Family<prometheus::Gauge>& entries_;
  prometheus::Family<prometheus::Gauge>& events_;
  prometheus::Family<prometheus::Counter>& traffic_;
  prometheus::Family<prometheus::Histogram>& step_;
  prometheus::Histogram& step_hist_;
  prometheus::Counter& hits_;
  prometheus::Counter& misses_;

  struct Ha;
  std::unique_ptr<Ha> ha_;  // created on the first UpdateHa (only with [etcd])
};

}  // namespace cxlkv::orchestrator

#endif  // CXLKV_ORCHESTRATOR_DAEMON_SRC_METRICS_H_
