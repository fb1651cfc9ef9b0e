// cxlkv_directory_where: the cross-domain prefix directory through an orchestrator's Directory
// RPC. libcxlkv speaks gRPC to orchestrators already; it links no etcd client, so a serving
// process never carries etcd's generated protobuf types (whose descriptors could collide with
// another copy of the same .proto files loaded in the process, e.g. by Python's protobuf).
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "capi_internal.h"
#include "cxlkv/cxlkv.h"
#include "cxlkv/orchestrator/directory_client.h"
#include "nlohmann/json.hpp"

namespace {

// One client (its gRPC channels) per endpoint list, kept for the process: a new channel per
// call would pay a connection setup every time. Bounded: past 16 lists the cache starts over.
absl::StatusOr<std::shared_ptr<cxlkv::orchestrator::DirectoryClient>> ClientFor(
    const std::string& where) {
  static absl::Mutex mu;
  static auto* clients =
      new std::map<std::string, std::shared_ptr<cxlkv::orchestrator::DirectoryClient>>();
  absl::MutexLock l(&mu);
  auto it = clients->find(where);
  if (it != clients->end()) return it->second;
  auto c = cxlkv::orchestrator::DirectoryClient::Connect(where);
  if (!c.ok()) return c.status();
  if (clients->size() >= 16) clients->clear();
  std::shared_ptr<cxlkv::orchestrator::DirectoryClient> shared = *std::move(c);
  (*clients)[where] = shared;
  return shared;
}

}  // namespace

CXLKV_API int cxlkv_directory_where(const char* orchestrators, const cxlkv_prefix_key* key,
                                    char* buf, size_t len, size_t* needed) {
  using cxlkv::capi::Fail;
  if (orchestrators == nullptr || key == nullptr || (buf == nullptr && len != 0)) {
    return Fail(CXLKV_E_INVALID,
                "cxlkv_directory_where: orchestrators and key must be set (buf may be NULL "
                "only with len 0)");
  }
  auto client = ClientFor(orchestrators);
  if (!client.ok()) return cxlkv::capi::FromStatus(client.status());
  auto r = (*client)->Where(cxlkv::coherence::PrefixKey{key->lo, key->hi});
  if (!r.ok()) return cxlkv::capi::FromStatus(r.status());
  nlohmann::json j;
  std::vector<std::string> holders;
  j["domains"] = nlohmann::json::array();
  for (const auto& d : r->domains) {
    if (d.may_hold) holders.push_back(d.domain);
    j["domains"].push_back({{"domain", d.domain},
                            {"may_hold", d.may_hold},
                            {"anchor", d.anchor},
                            {"published", d.published},
                            {"fp_rate", d.fp_rate},
                            {"epoch", d.epoch},
                            {"age_ms", d.age_ms},
                            {"filter_bytes", d.filter_bytes},
                            {"keyed", d.keyed},
                            {"key_held", d.key_held}});
  }
  j["may_hold"] = holders;
  j["revision"] = r->revision;
  const std::string s = j.dump();
  if (needed != nullptr) *needed = s.size() + 1;
  if (buf == nullptr) return CXLKV_OK;
  if (len < s.size() + 1) {
    if (len > 0) {
      std::memcpy(buf, s.data(), len - 1);
      buf[len - 1] = '\0';
    }
    return Fail(CXLKV_E_INVALID, absl::StrCat("cxlkv_directory_where: the answer is ", s.size() + 1,
                                              " bytes, the buffer ", len));
  }
  std::memcpy(buf, s.c_str(), s.size() + 1);
  return CXLKV_OK;
}
