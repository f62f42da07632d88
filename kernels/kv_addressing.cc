#include "kernels/kv_addressing.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"

namespace kvd {

absl::Status ValidateKvCacheView(absl::string_view op, const KvCacheView& view) {
  if (view.dtype != DType::kF32 && view.dtype != DType::kInt8) {
    return absl::UnimplementedError(
        absl::StrCat(op, ": cache.dtype ", std::string(DTypeName(view.dtype)),
                     " is not supported by the CPU backend (f32 and int8 only)"));
  }
  if (view.chunks == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(op, ": cache.chunks is null"));
  auto positive = [&](absl::string_view field, int64_t value) -> absl::Status {
    if (value > 0) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": ", field, " must be positive, got ", value));
  };
  for (absl::Status s :
       {positive("cache.num_chunks", view.num_chunks),
        positive("cache.num_kv_heads", view.num_kv_heads),
        positive("cache.block_size", view.block_size), positive("cache.head_dim", view.head_dim)}) {
    if (!s.ok()) return s;
  }
  if (view.chunk_shift < 0 || view.chunk_shift > 30) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": cache.chunk_shift must be in [0, 30], got ", view.chunk_shift));
  }
  if (view.k_offset_bytes < 0 || view.v_offset_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": cache.k_offset_bytes (",
                                                   view.k_offset_bytes, ") and v_offset_bytes (",
                                                   view.v_offset_bytes, ") must be >= 0"));
  }
  constexpr int64_t kFloat = sizeof(float);
  if (view.block_bytes % kFloat != 0 || view.k_offset_bytes % kFloat != 0 ||
      view.v_offset_bytes % kFloat != 0 || view.scale_offset_bytes % kFloat != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": cache.block_bytes (", view.block_bytes, "), k_offset_bytes (", view.k_offset_bytes,
        "), v_offset_bytes (", view.v_offset_bytes, ") and scale_offset_bytes (",
        view.scale_offset_bytes, ") must be multiples of 4 (fp32 values are read in place)"));
  }
  // Each factor is below 2^31; the products may pass 2^63.
  const int64_t elem_bytes = DTypeBits(view.dtype) / 8;
  const int64_t heads_x_tokens = int64_t{view.num_kv_heads} * view.block_size;
  int64_t data_bytes = 0;
  const bool overflow =
      __builtin_mul_overflow(heads_x_tokens, int64_t{view.head_dim} * elem_bytes, &data_bytes);
  if (overflow || view.block_bytes < data_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": cache.block_bytes (", view.block_bytes,
                     ") is smaller than num_kv_heads * block_size * head_dim * ", elem_bytes, " (",
                     overflow ? "past int64" : absl::StrCat(data_bytes), ")"));
  }
  return ValidateKvScales(op, view);
}

absl::Status ValidateBlockId(absl::string_view op, absl::string_view field, int64_t block,
                             void* const* chunks, int32_t num_chunks, int32_t chunk_shift) {
  const int64_t capacity = int64_t{num_chunks} << chunk_shift;
  if (block < 0 || block >= capacity) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", field, " names block ", block,
                                                   ", outside the arena's ", capacity,
                                                   " blocks (num_chunks << chunk_shift)"));
  }
  if (chunks[block >> chunk_shift] == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": ", field, " names block ", block,
                                                   " in released (null) chunk ",
                                                   block >> chunk_shift));
  }
  return absl::OkStatus();
}

}  // namespace kvd
