#include "state_write.h"

namespace cxlkv::orchestrator {

UnknownWrite ResolveUnknownWrite(const std::string& text, std::int64_t seen,
                                 std::int64_t back_revision, const std::string& back_value) {
  // Landed: written after the guard's revision, and with this write's bytes (each write
  // carries a new generation, so no other write has the same text).
  if (back_revision > seen && back_value == text) return UnknownWrite::kLanded;
  if (back_revision == seen) return UnknownWrite::kDidNotLand;
  return UnknownWrite::kAnotherWriter;
}

}  // namespace cxlkv::orchestrator
