#ifndef KVD_KERNELS_CUDA_KV_ROW_MAP_H_
#define KVD_KERNELS_CUDA_KV_ROW_MAP_H_

// A tensor-map (TMA) view of device memory for kernels that copy bf16 K/V rows at head_dim
// 128 with the tensor memory accelerator (sm_90): [base, base + 256 * rows) seen as rows of
// 256 bytes (one K or V row), read in boxes of 16 rows x 64 elements (2 KB) in the 128-byte
// swizzle. Encoded on the host over every buffer a backend has allocated, passed to kernels
// by value; a kernel checks that the rows it wants lie in the view and copies any others
// itself, so a view older than the arena (e.g. in a captured graph) is slower, never wrong.

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvd::cuda {

inline constexpr int kKvRowBytes = 256;  // bf16 at head_dim 128
inline constexpr int kKvBoxRows = 16;
inline constexpr int kKvBoxElements = 64;  // a box row: 128 bytes, the swizzle's row
inline constexpr int kKvBoxRowBytes = kKvBoxElements * 2;

struct KvRowMap {
  CUtensorMap map;
  uint64_t base = 0;
  int64_t num_rows = 0;  // 0: an empty view (nothing goes through it)
};

// Encodes the view of [lo, hi) into `out` (lo 256-byte aligned). cudaErrorNotSupported
// where the driver has no tensor maps or the range spans 2^31 rows or more; `out` is then
// an empty view. `data` (default: lo itself) is the memory the boxes actually read, an
// alias tests use to tell rows copied through the view from rows copied around it.
cudaError_t MakeKvRowMap(uintptr_t lo, uintptr_t hi, KvRowMap& out, const void* data = nullptr);

// Whether `view` (may be null) holds any rows: the TMA kernels run only then.
inline bool HasRows(const KvRowMap* view) { return view != nullptr && view->num_rows > 0; }

}  // namespace kvd::cuda

#endif  // KVD_KERNELS_CUDA_KV_ROW_MAP_H_
