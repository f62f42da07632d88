#include "cache/kv_layout.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvd {
namespace {

// Scale bytes of one token and KV head in one block of one region.
int64_t ScaleBytesPerTokenHead(DType dtype, int32_t head_dim) {
  switch (dtype) {
    case DType::kInt8:
      return 4;  // fp32 scale
    case DType::kInt4: {
      const int32_t group = std::min(head_dim, KvLayout::kInt4GroupSize);
      return 4 * (head_dim / group);  // fp16 scale + fp16 zero per group
    }
    default:
      return 0;
  }
}

// *out = bytes rounded up to KvLayout::kQuantizedAlignment; false on overflow.
bool AlignUp(int64_t bytes, int64_t* out) {
  constexpr int64_t kAlign = KvLayout::kQuantizedAlignment;
  if (__builtin_add_overflow(bytes, kAlign - 1, out)) return false;
  *out -= *out % kAlign;
  return true;
}

uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  return h;
}

}  // namespace

absl::StatusOr<KvLayout> KvLayout::Create(const KvShape& shape, DType dtype, int32_t block_size) {
  if (shape.num_layers <= 0 || shape.num_kv_heads <= 0 || shape.head_dim <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("KV shape must be positive, got num_layers=%d num_kv_heads=%d "
                        "head_dim=%d",
                        shape.num_layers, shape.num_kv_heads, shape.head_dim));
  }
  if (block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size must be positive, got ", block_size));
  }
  const int64_t head_bits = int64_t{shape.head_dim} * DTypeBits(dtype);
  if (head_bits % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "head_dim=%d of %s is not a whole number of bytes", shape.head_dim, DTypeName(dtype)));
  }
  if (dtype == DType::kInt4 && shape.head_dim > kInt4GroupSize &&
      shape.head_dim % kInt4GroupSize != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "int4 KV needs head_dim divisible by %d, got %d", kInt4GroupSize, shape.head_dim));
  }
  // Sizes past these are no real model, and the products below would overflow (undefined):
  // the regions are counted in int32, and one block of all of them must fit in int64.
  auto too_large = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KV shape too large: num_layers=%d num_kv_heads=%d head_dim=%d block_size=%d: %s",
        shape.num_layers, shape.num_kv_heads, shape.head_dim, block_size, what));
  };
  if (shape.num_layers > std::numeric_limits<int32_t>::max() / 2) {
    return too_large("2 * num_layers regions do not fit in 32 bits");
  }
  const int64_t heads_x_tokens = int64_t{shape.num_kv_heads} * block_size;  // < 2^62
  int64_t region_bits = 0;
  int64_t region_scale = 0;
  int64_t region_all = 0;
  int64_t block_all = 0;
  int64_t scale_offset = 0;
  bool overflow = __builtin_mul_overflow(heads_x_tokens, head_bits, &region_bits);
  if (dtype == DType::kFp8E4M3) {
    region_scale = int64_t{4} * shape.num_kv_heads;  // one fp32 scale a head
  } else {
    overflow = overflow ||
               __builtin_mul_overflow(heads_x_tokens, ScaleBytesPerTokenHead(dtype, shape.head_dim),
                                      &region_scale);
  }
  if (!overflow) {
    scale_offset = region_bits / 8;
    region_all = scale_offset;
    if (region_scale > 0) {
      overflow = !AlignUp(region_bits / 8, &scale_offset) ||
                 __builtin_add_overflow(scale_offset, region_scale, &region_all) ||
                 !AlignUp(region_all, &region_all);
    }
  }
  if (overflow || __builtin_mul_overflow(region_all, int64_t{2} * shape.num_layers, &block_all)) {
    return too_large("one block's bytes do not fit in 64 bits");
  }
  KvLayout layout;
  layout.shape_ = shape;
  layout.dtype_ = dtype;
  layout.block_size_ = block_size;
  layout.region_block_bytes_ = region_all;
  layout.region_block_data_bytes_ = region_bits / 8;
  layout.region_block_scale_bytes_ = region_scale;
  layout.region_scale_offset_bytes_ = scale_offset;
  return layout;
}

uint64_t KvLayout::Fingerprint() const {
  uint64_t h = 0x6b76645f6b76ULL;  // "kvd_kv"
  h = Mix(h, static_cast<uint64_t>(shape_.num_layers));
  h = Mix(h, static_cast<uint64_t>(shape_.num_kv_heads));
  h = Mix(h, static_cast<uint64_t>(shape_.head_dim));
  h = Mix(h, static_cast<uint64_t>(dtype_));
  h = Mix(h, static_cast<uint64_t>(block_size_));
  return h;
}

std::string KvLayout::DebugString() const {
  return absl::StrFormat("%d layers x %d KV heads x %d head_dim, %s, %d tokens/block",
                         shape_.num_layers, shape_.num_kv_heads, shape_.head_dim, DTypeName(dtype_),
                         block_size_);
}

}  // namespace kvd
