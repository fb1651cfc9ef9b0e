#include "wire.h"

#include <cstdint>
#include <string>

namespace cxlkv::coordinator {

nlohmann::json KeyJson(const ObjectKey& k) {
  return nlohmann::json{{"chunk_hash_hex", k.chunk_hash_hex},
                        {"model_name", k.model_name},
                        {"kv_rank", k.kv_rank},
                        {"object_group_id", k.object_group_id},
                        {"cache_salt", k.cache_salt}};
}

ObjectKey KeyFromJson(const nlohmann::json& j) {
  ObjectKey k;
  k.chunk_hash_hex = j.at("chunk_hash_hex").get<std::string>();
  k.model_name = j.at("model_name").get<std::string>();
  k.kv_rank = j.at("kv_rank").get<std::int64_t>();
  k.object_group_id = j.at("object_group_id").get<std::int64_t>();
  k.cache_salt = j.at("cache_salt").get<std::string>();
  return k;
}

}  // namespace cxlkv::coordinator
