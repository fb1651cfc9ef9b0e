// The LMCache coordinator's HTTP body parser (orchestrator/lmcache, ParseBody), which reads
// whatever any client holding a token sends: it must refuse or accept without crashing,
// reading out of bounds or blowing the stack, an accepted body must respect max_batch (reserve,
// finish, abort; a lookup may hold any number of keys), its keys and layouts must go through
// the Coordinator's checks, and an accepted body written back as JSON must parse to the same
// request. The first byte picks the route.
// CXLKV_FUZZ_WRITE_SEED=PATH writes one valid body per route (PATH.0 .. PATH.3) and exits.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cxlkv/orchestrator/lmcache/coordinator.h"
#include "cxlkv/orchestrator/lmcache/service.h"
#include "nlohmann/json.hpp"

namespace lmc = ::cxlkv::coordinator;
using json = nlohmann::json;

namespace {

constexpr const char* kRoutes[] = {"/v1/writes/reserve", "/v1/writes/finish", "/v1/writes/abort",
                                   "/v1/lookup"};
constexpr std::uint32_t kMaxBatch = 8;

json KeyJson(const lmc::ObjectKey& k) {
  return json{{"chunk_hash_hex", k.chunk_hash_hex},
              {"model_name", k.model_name},
              {"kv_rank", k.kv_rank},
              {"object_group_id", k.object_group_id},
              {"cache_salt", k.cache_salt}};
}

// The request written back in the wire's form.
json BodyOf(std::size_t route, const lmc::WireRequest& r) {
  json b{{"region_epoch", r.region_epoch}};
  json a = json::array();
  if (route == 0) {
    for (const auto& it : r.items) {
      a.push_back({{"key", KeyJson(it.key)},
                   {"layout", {{"shapes", it.layout.shapes}, {"dtypes", it.layout.dtypes}}}});
    }
    b["items"] = a;
  } else if (route <= 2) {
    for (const auto& ref : r.refs) a.push_back({{"key", KeyJson(ref.key)}, {"token", ref.token}});
    b["reservations"] = a;
  } else {
    for (const auto& k : r.keys) a.push_back(KeyJson(k));
    b["keys"] = a;
  }
  return b;
}

bool SameKeys(const std::vector<lmc::ObjectKey>& a, const std::vector<lmc::ObjectKey>& b) {
  return a == b;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* path = std::getenv("CXLKV_FUZZ_WRITE_SEED");
  if (path == nullptr) return 0;
  const json key{{"chunk_hash_hex", "0aff"}, {"model_name", "m"}, {"kv_rank", 0}};
  const std::string bodies[] = {
      json{{"region_epoch", "e"},
           {"items",
            {{{"key", key}, {"layout", {{"shapes", {{2, 64}}}, {"dtypes", {"bfloat16"}}}}}}}}
          .dump(),
      json{{"region_epoch", "e"}, {"reservations", {{{"key", key}, {"token", "t"}}}}}.dump(),
      json{{"region_epoch", "e"}, {"reservations", json::array()}}.dump(),
      json{{"region_epoch", "e"}, {"keys", {key}}}.dump()};
  for (int i = 0; i < 4; ++i) {
    const std::string p = std::string(path) + "." + std::to_string(i);
    std::FILE* f = std::fopen(p.c_str(), "wb");
    if (f == nullptr) std::abort();
    std::fputc(i, f);
    std::fwrite(bodies[i].data(), 1, bodies[i].size(), f);
    std::fclose(f);
  }
  std::exit(0);
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t route = data[0] % 4;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto req = lmc::ParseBody(kRoutes[route], body, kMaxBatch);
  if (!req.ok()) {
    if (req.status().code() != absl::StatusCode::kInvalidArgument) std::abort();
    return 0;
  }
  // Lookups have no max_batch (LMCache serves any size; the Coordinator takes them in chunks).
  if (req->items.size() > kMaxBatch || req->refs.size() > kMaxBatch) std::abort();
  for (const auto& it : req->items) {
    (void)lmc::CheckKey(it.key);
    (void)lmc::LayoutBytes(it.layout);
  }
  for (const auto& k : req->keys) (void)lmc::CheckKey(k);
  // Written back, the request parses to itself.
  auto again = lmc::ParseBody(kRoutes[route], BodyOf(route, *req).dump(), kMaxBatch);
  if (!again.ok() || again->region_epoch != req->region_epoch ||
      !SameKeys(again->keys, req->keys) || again->items.size() != req->items.size() ||
      again->refs.size() != req->refs.size()) {
    std::abort();
  }
  for (std::size_t i = 0; i < req->items.size(); ++i) {
    if (!(again->items[i].key == req->items[i].key) ||
        !(again->items[i].layout == req->items[i].layout)) {
      std::abort();
    }
  }
  for (std::size_t i = 0; i < req->refs.size(); ++i) {
    if (!(again->refs[i].key == req->refs[i].key) || again->refs[i].token != req->refs[i].token) {
      std::abort();
    }
  }
  return 0;
}
