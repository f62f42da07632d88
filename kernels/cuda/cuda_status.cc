#include "kernels/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/cublas_api.h"

namespace kvd {
namespace {

// The runtime documents these as leaving the process in an inconsistent state, every later
// call returning the same error, until the process is relaunched.
bool LosesTheContext(cudaError_t err) {
  switch (err) {
    case cudaErrorContained:
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorContextIsDestroyed:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorTensorMemoryLeak:
    case cudaErrorECCUncorrectable:
    case cudaErrorMpsClientTerminated:
    case cudaErrorExternalDevice:
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::Status CudaStatus(cudaError_t err, absl::string_view op) {
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // reported here; a sticky error is not cleared by this (see the header)
  std::string message =
      absl::StrCat(op, ": ", cudaGetErrorString(err), " (", cudaGetErrorName(err), ")");
  if (LosesTheContext(err)) {
    return absl::DataLossError(
        absl::StrCat(message, "; the CUDA context is lost until the process restarts"));
  }
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
      return absl::InvalidArgumentError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CublasStatus(cublasStatus_t err, absl::string_view op) {
  if (err == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  cudaGetLastError();  // as in CudaStatus
  // A cuBLAS result comes from a loaded library; the number stands in should none be.
  const CublasApi* const api = LoadedCublas();
  std::string message = api != nullptr
                            ? absl::StrCat(op, ": ", api->cublasGetStatusString(err), " (",
                                           api->cublasGetStatusName(err), ")")
                            : absl::StrCat(op, ": cuBLAS status ", static_cast<int>(err));
  switch (err) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_INVALID_VALUE:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace kvd
