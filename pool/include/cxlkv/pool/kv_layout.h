// cxlkv/pool/kv_layout.h — the shape of a model's KV cache, from which block sizes follow:
//   block_bytes = 2 (K and V) × layers × kv_heads × head_dim × dtype_bytes × tokens_per_block
// Llama-3-70B in fp16: 2 × 80 × 8 × 128 × 2 = 320 KiB per token; 16 tokens = 5 MiB.
#ifndef CXLKV_POOL_KV_LAYOUT_H_
#define CXLKV_POOL_KV_LAYOUT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlkv/pool/layout.h"

namespace cxlkv::pool {

struct KvLayout {
  std::uint32_t layers = 0;
  std::uint32_t kv_heads = 0;
  std::uint32_t head_dim = 0;
  std::uint32_t dtype_bytes = 0;
  std::uint32_t tokens_per_block = 0;
  KvLayoutKind kind = KvLayoutKind::kContiguous;

  std::uint64_t BytesPerToken() const { return 2ull * layers * kv_heads * head_dim * dtype_bytes; }
  std::uint64_t BlockBytes() const { return BytesPerToken() * tokens_per_block; }
  bool operator==(const KvLayout&) const = default;

  // Every field non-zero, dtype_bytes in {1, 2, 4}, block size a multiple of 64 bytes and
  // at most 4 GiB. kInvalidArgument names the field.
  absl::Status Validate() const;
  std::string ToString() const;

  KvLayoutRecord ToRecord() const;
  static KvLayout FromRecord(const KvLayoutRecord& r);
};

// Named presets: "llama3-70b" (default), "llama3-8b", "llama2-7b", "mistral-7b",
// "qwen2-72b"; or "L=80,H=8,D=128,B=2,T=16" with optional ",layer-separate".
absl::StatusOr<KvLayout> ParseKvLayout(absl::string_view text);
KvLayout Llama3_70B();

}  // namespace cxlkv::pool

#endif  // CXLKV_POOL_KV_LAYOUT_H_
