// The one place in gpu/ where a cudaError_t becomes an absl::Status (the house rule: errors are
// turned into a Status once, at the seam, with the object named).
#ifndef CXLKV_GPU_SRC_CUDA_STATUS_H_
#define CXLKV_GPU_SRC_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <ctime>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace cxlkv::gpu::internal {

// "<object>: <call>: <cudaErrorName>: <description>" with a code from the error class:
// kUnavailable (no device / driver), kResourceExhausted (out of memory), kInvalidArgument,
// kUnimplemented (not supported), kAlreadyExists (already registered), kInternal otherwise.
absl::Status CudaStatus(cudaError_t err, absl::string_view object, absl::string_view call);

inline std::int64_t NowNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace cxlkv::gpu::internal

#define CXLKV_CUDA_RETURN_IF_ERROR(expr, object)                                 \
  do {                                                                           \
    const cudaError_t cxlkv_cuda_err_ = (expr);                                  \
    if (cxlkv_cuda_err_ != cudaSuccess) {                                        \
      return ::cxlkv::gpu::internal::CudaStatus(cxlkv_cuda_err_, object, #expr); \
    }                                                                            \
  } while (0)

#endif  // CXLKV_GPU_SRC_CUDA_STATUS_H_
