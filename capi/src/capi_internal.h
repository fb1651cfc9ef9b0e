// Shared between the C API's translation units (cxlkv.cc, gpu.cc).
#ifndef CXLKV_CAPI_SRC_CAPI_INTERNAL_H_
#define CXLKV_CAPI_SRC_CAPI_INTERNAL_H_

#include <string>

#include "cxlkv/cxlkv.h"
#include "cxlkv/pool/arena.h"

namespace cxlkv::capi {

// Sets this thread's cxlkv_last_error() message and returns code.
int Fail(int code, std::string message);
// The arena behind a C handle.
const pool::Arena& ArenaOf(const cxlkv_arena* arena);

}  // namespace cxlkv::capi

#endif  // CXLKV_CAPI_SRC_CAPI_INTERNAL_H_
