#include "kernels/cuda/kv_row_map.h"

#include <cudaTypedefs.h>

namespace kvd::cuda {
namespace {

// cuTensorMapEncodeTiled from the driver, found once through the runtime (no link against
// libcuda); null where the driver lacks it.
PFN_cuTensorMapEncodeTiled_v12000 EncodeTiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // handled (no TMA view): not an error for the next launch
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

}  // namespace

cudaError_t MakeKvRowMap(uintptr_t lo, uintptr_t hi, KvRowMap& out, const void* data) {
  out = KvRowMap{};
  if (lo % kKvRowBytes != 0 || hi <= lo) return cudaErrorInvalidValue;
  const uint64_t rows = (uint64_t{hi} - lo + kKvRowBytes - 1) / kKvRowBytes;
  if (rows >= (uint64_t{1} << 31)) return cudaErrorNotSupported;  // coordinates are int32
  const PFN_cuTensorMapEncodeTiled_v12000 encode = EncodeTiled();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[2] = {kKvRowBytes / 2, rows};  // bf16 elements per row, rows
  const cuuint64_t strides[1] = {kKvRowBytes};         // bytes from one row to the next
  const cuuint32_t box[2] = {kKvBoxElements, kKvBoxRows};
  const cuuint32_t element_strides[2] = {1, 1};
  void* global = data != nullptr ? const_cast<void*>(data) : reinterpret_cast<void*>(lo);
  if (reinterpret_cast<uintptr_t>(global) % kKvRowBytes != 0) return cudaErrorInvalidValue;
  // No L2 promotion: a box row is a whole 128-byte line already. Promoting each to 256 bytes
  // (the other half of the row, which the kernel's other box reads anyway) cost the L2 a
  // fifth more requests, and the decode kernel is L2-bound (H200, ncu, 4 x 128k: 21.0M
  // L2 read requests, 4.2M of them hits, against 16.8M; then 0.95 of copy bandwidth per
  // call at 4 x 128k and 64 x 4k against 1.01 and 0.99 without it).
  if (encode(&out.map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, global, dims, strides, box,
             element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_NONE,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    out = KvRowMap{};
    return cudaErrorNotSupported;
  }
  out.base = lo;
  out.num_rows = static_cast<int64_t>(rows);
  return cudaSuccess;
}

}  // namespace kvd::cuda
