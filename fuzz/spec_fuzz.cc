// Fuzzes the parsers of operator-supplied strings: source specs, sizes and KV layouts.
// A spec that parses must round-trip through ToString().
#include <cstdint>
#include <cstdlib>
#include <string>

#include "cxlkv/base/bytes.h"
#include "cxlkv/pool/kv_layout.h"
#include "cxlkv/pool/spec.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto spec = cxlkv::pool::ParseSourceSpec(text);
  if (spec.ok()) {
    auto again = cxlkv::pool::ParseSourceSpec(spec->ToString());
    if (!again.ok() || !(*again == *spec)) std::abort();
  }
  (void)cxlkv::base::ParseSize(text);
  auto layout = cxlkv::pool::ParseKvLayout(text);
  if (layout.ok() && !layout->Validate().ok()) std::abort();
  return 0;
}
