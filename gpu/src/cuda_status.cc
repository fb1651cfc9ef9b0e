#include "cuda_status.h"

#include "absl/strings/str_cat.h"

namespace cxlkv::gpu::internal {

absl::Status CudaStatus(cudaError_t err, absl::string_view object, absl::string_view call) {
  // Keep only the function name of a call expression for the message.
  const absl::string_view fn = call.substr(0, call.find('('));
  std::string msg =
      absl::StrCat(object, ": ", fn, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  switch (err) {
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return absl::UnavailableError(msg);
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(msg);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidMemcpyDirection:
      return absl::InvalidArgumentError(msg);
    case cudaErrorNotSupported:
      return absl::UnimplementedError(msg);
    case cudaErrorHostMemoryAlreadyRegistered:
      return absl::AlreadyExistsError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace cxlkv::gpu::internal
