// The C API's error reporting: every Status becomes a CXLKV_E_* code plus a thread-local
// message (cxlkv_last_error); nothing in the C API throws.
#include <string>

#include "absl/status/status.h"
#include "capi_internal.h"
#include "cxlkv/cxlkv.h"

namespace {
thread_local std::string last_error;
}  // namespace

namespace cxlkv::capi {

int Fail(int code, std::string message) {
  last_error = std::move(message);
  return code;
}

const std::string& LastError() { return last_error; }

int FromStatus(const absl::Status& st) {
  if (st.ok()) return CXLKV_OK;
  int code = CXLKV_E_INTERNAL;
  switch (st.code()) {
    case absl::StatusCode::kInvalidArgument:
      code = CXLKV_E_INVALID;
      break;
    case absl::StatusCode::kNotFound:
      code = CXLKV_E_NOT_FOUND;
      break;
    case absl::StatusCode::kPermissionDenied:
      code = CXLKV_E_PERMISSION;
      break;
    case absl::StatusCode::kAlreadyExists:
      code = CXLKV_E_EXISTS;
      break;
    case absl::StatusCode::kDataLoss:
      code = CXLKV_E_CORRUPT;
      break;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kUnimplemented:
      code = CXLKV_E_MISMATCH;
      break;
    case absl::StatusCode::kResourceExhausted:
      code = CXLKV_E_FULL;
      break;
    case absl::StatusCode::kOutOfRange:
      code = CXLKV_E_FOREIGN;
      break;
    default:
      break;
  }
  return Fail(code, std::string(st.message()));
}

}  // namespace cxlkv::capi

CXLKV_API const char* cxlkv_strerror(int code) {
  switch (code) {
    case CXLKV_OK:
      return "success";
    case CXLKV_E_INVALID:
      return "invalid argument";
    case CXLKV_E_NOT_FOUND:
      return "not found";
    case CXLKV_E_PERMISSION:
      return "permission denied";
    case CXLKV_E_EXISTS:
      return "an arena already exists";
    case CXLKV_E_CORRUPT:
      return "corrupt metadata";
    case CXLKV_E_MISMATCH:
      return "mismatched, foreign or busy arena";
    case CXLKV_E_FULL:
      return "no space left";
    case CXLKV_E_DOUBLE_FREE:
      return "double free";
    case CXLKV_E_STALE:
      return "stale block reference";
    case CXLKV_E_FOREIGN:
      return "not a block of this arena";
    case CXLKV_E_INTERNAL:
      return "internal error";
    case CXLKV_E_NO_CUDA:
      return "built without CUDA";
    case CXLKV_E_NO_DEVICE:
      return "no CUDA device";
    case CXLKV_E_PENDING:
      return "not finished yet";
    case CXLKV_E_CUDA:
      return "CUDA error";
    case CXLKV_E_REVOKED:
      return "extent revoked: capacity lease lapsed";
    case CXLKV_E_BUSY:
      return "busy: I/O in flight, pinned or cooling down; retry";
    default:
      return "unknown error code";
  }
}

CXLKV_API const char* cxlkv_last_error(void) { return last_error.c_str(); }
