#ifndef KVD_KERNELS_CUDA_CUDA_STATUS_H_
#define KVD_KERNELS_CUDA_CUDA_STATUS_H_

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvd {

// Turns a CUDA runtime result into a Status naming the failed operation, e.g.
// "PagedAttention: decode kernel: an illegal memory access was encountered
// (cudaErrorIllegalAddress)". OK for cudaSuccess. Thread safe. Codes: ResourceExhausted (out
// of memory), InvalidArgument, Unavailable (no usable device), DataLoss for the errors the
// runtime calls sticky (a kernel fault: the context is lost and every later call fails, the
// Backend contract's "unusable from then on"), Internal otherwise.
//
// A failure also resets the calling thread's last CUDA error (cudaGetLastError): the
// failure is reported here, and a kernel launcher that returns cudaGetLastError() after its
// launch must not report it again as its own (a failed cudaMalloc, handled as "no more
// memory", would otherwise fail the next valid op). A sticky error (an illegal address, a
// kernel fault) stays visible all the same: the context is lost, and every later call
// returns it again.
absl::Status CudaStatus(cudaError_t err, absl::string_view op);

// As CudaStatus, for cuBLAS and cuBLASLt results; a failure resets the last CUDA error too
// (the library's own runtime calls may have set it). A kernel fault does not come back this
// way: cuBLAS enqueues its kernels without waiting, and reported success after one on the
// H200; the backend's next CUDA call reports it (CudaStatus: DataLoss).
absl::Status CublasStatus(cublasStatus_t err, absl::string_view op);

}  // namespace kvd

// Evaluates a cudaError_t / cublasStatus_t expression and returns its Status from the
// enclosing function when it failed. `op` names the backend operation for the message.
#define KVD_RETURN_IF_CUDA_ERROR(expr, op)                                                 \
  do {                                                                                     \
    if (::absl::Status kvd_status_ = ::kvd::CudaStatus((expr), (op)); !kvd_status_.ok()) { \
      return kvd_status_;                                                                  \
    }                                                                                      \
  } while (0)

#define KVD_RETURN_IF_CUBLAS_ERROR(expr, op)                                                 \
  do {                                                                                       \
    if (::absl::Status kvd_status_ = ::kvd::CublasStatus((expr), (op)); !kvd_status_.ok()) { \
      return kvd_status_;                                                                    \
    }                                                                                        \
  } while (0)

#endif  // KVD_KERNELS_CUDA_CUDA_STATUS_H_
