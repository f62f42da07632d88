#ifndef KVD_KERNELS_CUDA_CUDA_SUPPORT_H_
#define KVD_KERNELS_CUDA_CUDA_SUPPORT_H_

// What the CUDA backend can run, in plain C++ (no CUDA header), so that the tools can
// decide on a device before they build a backend, also in a build without CUDA.

#include <string>

#include "absl/strings/str_cat.h"

namespace kvd::cuda {

// The oldest GPU the kernels run on, as major * 10 + minor: they are built as sm_90 code
// and PTX (CMakeLists.txt), and use thread block clusters and TMA.
inline constexpr int kMinComputeCapability = 90;

// "has compute capability 8.0; kvd's CUDA kernels need 9.0 (Hopper) or newer", for a GPU of
// `capability` below kMinComputeCapability.
inline std::string ComputeCapabilityShortfall(int capability) {
  return absl::StrCat("has compute capability ", capability / 10, ".", capability % 10,
                      "; kvd's CUDA kernels need ", kMinComputeCapability / 10, ".",
                      kMinComputeCapability % 10, " (Hopper) or newer");
}

// Largest head_dim the generic attention kernel handles (one value per lane of a warp).
// Sizes between it and the fast kernels' (e.g. 96) stay Unimplemented rather than
// silently slow.
inline constexpr int kGenericAttentionMaxHeadDim = 32;
// ...and for an int8 cache, which no fast kernel reads yet, up to four values a lane: the
// fast kernels' 64 and 128 (HasAttentionKernel) go there too.
inline constexpr int kGenericAttentionMaxInt8HeadDim = 128;

// Whether the backend has a paged attention kernel for `head_dim`: the fast kernels' 64 and
// 128, or the generic kernel's sizes up to kGenericAttentionMaxHeadDim.
constexpr bool HasAttentionKernel(int head_dim) {
  return head_dim == 64 || head_dim == 128 ||
         (head_dim > 0 && head_dim <= kGenericAttentionMaxHeadDim);
}

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_CUDA_SUPPORT_H_
