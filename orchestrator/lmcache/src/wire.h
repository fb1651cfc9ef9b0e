// The coordinator's JSON for an object key, one form for both places it is written: the HTTP
// replies LMCache reads (service.cc) and the state file and journal (coordinator.cc).
#ifndef CXLKV_ORCHESTRATOR_LMCACHE_WIRE_H_
#define CXLKV_ORCHESTRATOR_LMCACHE_WIRE_H_

#include "cxlkv/orchestrator/lmcache/index_key.h"  // ObjectKey
#include "nlohmann/json.hpp"

namespace cxlkv::coordinator {

// {"chunk_hash_hex", "model_name", "kv_rank", "object_group_id", "cache_salt"}: LMCache's
// ObjectKey fields under LMCache's names.
nlohmann::json KeyJson(const ObjectKey& k);
// The inverse, for the state file (already validated when it was written: a missing field or
// a wrong type throws nlohmann::json::exception, which the loader reports as corrupt).
ObjectKey KeyFromJson(const nlohmann::json& j);

}  // namespace cxlkv::coordinator

#endif  // CXLKV_ORCHESTRATOR_LMCACHE_WIRE_H_
