#include "cxlkv/pool/kv_layout.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace cxlkv::pool {

KvLayout Llama3_70B() { return KvLayout{80, 8, 128, 2, 16, KvLayoutKind::kContiguous}; }

absl::Status KvLayout::Validate() const {
  auto bad = [this](absl::string_view field, absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV layout ", ToString(), ": ", field, " ", why));
  };
  if (layers == 0) return bad("layers", "must be > 0");
  if (kv_heads == 0) return bad("kv_heads", "must be > 0");
  if (head_dim == 0) return bad("head_dim", "must be > 0");
  if (dtype_bytes != 1 && dtype_bytes != 2 && dtype_bytes != 4) {
    return bad("dtype_bytes", "must be 1 (fp8/int8), 2 (fp16/bf16) or 4 (fp32)");
  }
  if (tokens_per_block == 0) return bad("tokens_per_block", "must be > 0");
  if (kind != KvLayoutKind::kContiguous && kind != KvLayoutKind::kLayerSeparate) {
    return bad("kind", "must be contiguous or layer-separate");
  }
  const std::uint64_t bytes = BlockBytes();
  if (bytes % 64 != 0) return bad("block size", "must be a multiple of 64 bytes");
  if (bytes > (4ull << 30)) return bad("block size", "must be at most 4 GiB");
  return absl::OkStatus();
}

std::string KvLayout::ToString() const {
  return absl::StrCat("L=", layers, ",H=", kv_heads, ",D=", head_dim, ",B=", dtype_bytes,
                      ",T=", tokens_per_block,
                      kind == KvLayoutKind::kLayerSeparate ? ",layer-separate" : "");
}

KvLayoutRecord KvLayout::ToRecord() const {
  return KvLayoutRecord{layers,      kv_heads,         head_dim,
                        dtype_bytes, tokens_per_block, static_cast<std::uint32_t>(kind),
                        {0, 0}};
}

KvLayout KvLayout::FromRecord(const KvLayoutRecord& r) {
  return KvLayout{r.layers,      r.kv_heads,         r.head_dim,
                  r.dtype_bytes, r.tokens_per_block, static_cast<KvLayoutKind>(r.kind)};
}

absl::StatusOr<KvLayout> ParseKvLayout(absl::string_view text) {
  if (text.empty() || text == "llama3-70b") return Llama3_70B();
  if (text == "llama3-8b") return KvLayout{32, 8, 128, 2, 16, KvLayoutKind::kContiguous};
  if (text == "llama2-7b") return KvLayout{32, 32, 128, 2, 16, KvLayoutKind::kContiguous};
  if (text == "mistral-7b") return KvLayout{32, 8, 128, 2, 16, KvLayoutKind::kContiguous};
  if (text == "qwen2-72b") return KvLayout{80, 8, 128, 2, 16, KvLayoutKind::kContiguous};
  KvLayout out;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    if (part == "layer-separate") {
      out.kind = KvLayoutKind::kLayerSeparate;
      continue;
    }
    if (part == "contiguous") continue;
    const auto eq = part.find('=');
    std::uint32_t v = 0;
    if (eq == absl::string_view::npos || !absl::SimpleAtoi(part.substr(eq + 1), &v)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV layout '", text, "': '", part,
          "' is not KEY=NUMBER; use a preset (llama3-70b, llama3-8b, llama2-7b, mistral-7b, "
          "qwen2-72b) or L=layers,H=kv_heads,D=head_dim,B=dtype_bytes,T=tokens_per_block"));
    }
    const absl::string_view key = part.substr(0, eq);
    if (key == "L") {
      out.layers = v;
    } else if (key == "H") {
      out.kv_heads = v;
    } else if (key == "D") {
      out.head_dim = v;
    } else if (key == "B") {
      out.dtype_bytes = v;
    } else if (key == "T") {
      out.tokens_per_block = v;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("KV layout '", text, "': unknown key '", key, "' (L, H, D, B, T)"));
    }
  }
  if (auto st = out.Validate(); !st.ok()) return st;
  return out;
}

}  // namespace cxlkv::pool
