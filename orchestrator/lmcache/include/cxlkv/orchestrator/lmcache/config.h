// cxlkv/orchestrator/lmcache/config.h — the [lmcache] section of domain.toml: LMCache's memory
// coordinator API (docs/lmcache.md "The coordinator"), served by the orchestrator. Off without
// the section. This module owns the section's keys and reads them from the same text as the
// daemon (as tier/ does [placement]); the daemon only calls ParseCoordinatorConfig.
//
// The token file maps bearer tokens to tenants (LoadTenantTokens).
#ifndef CXLKV_ORCHESTRATOR_LMCACHE_CONFIG_H_
#define CXLKV_ORCHESTRATOR_LMCACHE_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cxlkv::coordinator {

struct CoordinatorConfig {
  std::string listen;              // HOST:PORT of the HTTP API; "" : off (no [lmcache] section)
  std::string token_file;          // required: bearer tokens and their tenants (LoadTenantTokens)
  // lmcache.token_file_readable = true: a token file group or others may read is accepted with
  // a warning (LMCache's own behaviour); by default it is refused (the token is the tenant).
  bool token_file_readable = false;
  // lmcache.token_min_length: the shortest token accepted (1..4096). LMCache accepts any
  // non-empty token; cxlkv asks 16 characters by default, a token being a tenant's whole
  // credential. 1 accepts LMCache's.
  std::uint32_t token_min_length = 16;
  std::string region_id;           // LMCache's --l1-shared-region-id; "" : the domain's name
  std::string layout_id;           // required: LMCache's --l1-shared-layout-id
  std::uint64_t region_bytes = 0;  // required: any size; in the pool's last extents (HostPoolBytes)
  std::uint64_t alignment_bytes = 2u << 20;     // a power of two, 64 B .. extent size
  std::uint32_t reservation_ttl_ms = 60000;     // an unfinished reservation is reclaimed after this
  std::uint32_t read_lease_ms = 10000;          // a looked-up object is not evicted for this long
  // A reserve/finish/abort's items: 0 (the default) none but the request's 64 MiB, as LMCache;
  // N refuses a larger batch (422 naming the setting), bounding how long one holds the lock.
  std::uint32_t max_batch = 0;
  std::uint32_t threads = 8;                    // HTTP worker threads
  std::string state_file;                       // "" : <domain.state_file>.lmcache
  // Finished objects are published in the domain's prefix index (hosts find them by chain
  // lease, no HTTP); an evicted one's range waits for the index to let it go.
  bool index = true;
  std::uint32_t index_wait_ms = 2000;  // a reserve waits this long for evicted ranges to come back
  // With the index, once the region is full a reserve evicts ahead: it leaves at least this
  // many bytes free or on their way back from the index, so that later reserves find them
  // free instead of waiting for the index's grace. kEvictAheadDefault: region_size / 64.
  static constexpr std::uint64_t kEvictAheadDefault = ~0ull;
  std::uint64_t evict_ahead_bytes = kEvictAheadDefault;
  std::map<std::string, std::uint64_t> quotas;  // [lmcache.quotas] tenant = bytes
  // Pin levels by namespace name "<tenant>/lmcache/<layout_id>": the domain's [[namespace]]
  // entries with model "lmcache" (filled by the daemon's config). Lower levels are evicted first.
  std::map<std::string, int> pins;
  bool enabled() const { return !listen.empty(); }
};

// Reads [lmcache] (and [lmcache.quotas]) from a domain.toml text; without the section the
// result is disabled. Errors are kInvalidArgument "<source>:<line>: key 'lmcache.<k>': <what>",
// or, for a missing required key, name the key with an example.
absl::StatusOr<CoordinatorConfig> ParseCoordinatorConfig(absl::string_view toml,
                                                         absl::string_view source_name);

// Checks [lmcache] against the domain: alignment within an extent (that the pool leaves hosts an
// extent is checked at start, when its size is known). Fills region_id and state_file defaults.
absl::Status ResolveCoordinatorConfig(CoordinatorConfig* c, const std::string& domain_name,
                                      const std::string& domain_state_file,
                                      std::uint64_t extent_bytes);

// The pool's layout with the coordinator on: hosts get the extents below host_pool_bytes, the
// coordinator's region is [host_pool_bytes, host_pool_bytes + region_bytes), in the pool's last
// ceil(region_bytes / extent_bytes) whole extents (a region of any size, e.g. LMCache's tests'
// 64 KiB, keeps an extent of its own: the rest of its last extent is no one's). Without it the
// whole pool is the hosts'.
std::uint64_t HostPoolBytes(const CoordinatorConfig& c, std::uint64_t pool_bytes,
                            std::uint64_t extent_bytes);

// What a token file must be (the [lmcache] settings token_file_readable, token_min_length).
struct TokenFileRules {
  bool accept_readable = false;
  std::uint32_t min_length = 16;
};

// Tokens and their tenants, from a file readable by its owner only. Either one bare token
// (LMCache's own token file: tenant "default"), or lines "TENANT TOKEN" ('#' starts a comment).
// Tokens: rules.min_length..4096 printable ASCII without spaces, each once; tenants:
// [A-Za-z0-9_.-]{1,64}. Errors name the file, the line and the fix (a short token: its length
// and the setting that accepts it). A file group or others may read is refused
// (kPermissionDenied: its octal mode, the chmod, and the setting that accepts it) unless
// `rules.accept_readable`; then `*warning` (when given) says so and the tokens load.
absl::StatusOr<std::map<std::string, std::string>> LoadTenantTokens(
    const std::string& path, const TokenFileRules& rules = {}, std::string* warning = nullptr);

}  // namespace cxlkv::coordinator

#endif  // CXLKV_ORCHESTRATOR_LMCACHE_CONFIG_H_
