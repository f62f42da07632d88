#include "kernels/cpu_kv_ops.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "kernels/kv_addressing.h"
#include "kernels/kv_quant.h"
#include "kernels/status_macros.h"

namespace kvd {
namespace {

// Bytes a parallel chunk should copy at least.
constexpr int64_t kMinChunkBytes = int64_t{1} << 16;

absl::Status Invalid(absl::string_view op, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what));
}

}  // namespace

absl::Status ValidateAppendKv(const AppendKvParams& p) {
  constexpr absl::string_view kOp = "AppendKv";
  if (p.num_tokens < 0) return Invalid(kOp, absl::StrCat("num_tokens is ", p.num_tokens));
  if (p.num_tokens == 0) return absl::OkStatus();
  if (absl::Status s = ValidateKvCacheView(kOp, p.cache); !s.ok()) return s;
  KVD_RETURN_IF_ERROR(ValidateAppendKvRows(p));
  const KvCacheView& c = p.cache;
  for (int32_t t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slot_mapping[t];
    if (slot == kNoSlot) continue;
    if (slot < 0) {
      return Invalid(kOp, absl::StrCat("slot_mapping[", t, "] is ", slot, "; allowed: >= 0, or ",
                                       kNoSlot, " for no write"));
    }
    if (absl::Status s =
            ValidateBlockId(kOp, absl::StrCat("slot_mapping[", t, "]"), slot / c.block_size,
                            c.chunks, c.num_chunks, c.chunk_shift);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status CpuAppendKv(const AppendKvParams& p, ThreadPool& pool) {
  KVD_RETURN_IF_ERROR(ValidateAppendKv(p));
  if (p.num_tokens == 0) return absl::OkStatus();
  const KvCacheView& c = p.cache;
  const int64_t width = int64_t{c.num_kv_heads} * c.head_dim;
  const int64_t row_bytes = sizeof(float) * int64_t{c.head_dim};
  const int64_t grain = std::max<int64_t>(1, kMinChunkBytes / (2 * width * sizeof(float)));
  // One row (token t's head h) of k or v into the block at `dst`.
  auto store = [&](char* dst, int32_t h, int64_t offset, const float* row) {
    if (c.dtype == DType::kInt8) {
      Int8BlockScales(c, dst, h)[offset] =
          QuantizeInt8KvRow(row, c.head_dim, Int8BlockHead(c, dst, h) + offset * c.head_dim);
    } else {
      std::memcpy(F32BlockHead(c, dst, h) + offset * c.head_dim, row, row_bytes);
    }
  };
  pool.ParallelFor(p.num_tokens, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (p.slot_mapping[t] == kNoSlot) continue;
      const int64_t block = p.slot_mapping[t] / c.block_size;
      const int64_t offset = p.slot_mapping[t] % c.block_size;
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        store(KeyBlock(c, block), h, offset, p.k + t * p.k_stride + int64_t{h} * c.head_dim);
        store(ValueBlock(c, block), h, offset, p.v + t * p.v_stride + int64_t{h} * c.head_dim);
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuCopyBlocks(const CopyBlocksParams& p, ThreadPool& pool) {
  constexpr absl::string_view kOp = "CopyBlocks";
  if (p.num_pairs == 0) return absl::OkStatus();  // negative: ValidateCopyBlocks
  if (absl::Status s = ValidateCopyBlocks(p); !s.ok()) return s;
  // CopyBlocksParams carries no chunk count, so the upper bound of an id cannot be checked
  // here (see the header); negative ids and ids in a null chunk are rejected.
  for (int32_t i = 0; i < p.num_pairs; ++i) {
    for (int64_t block : {int64_t{p.src[i]}, int64_t{p.dst[i]}}) {
      if (block < 0) return Invalid(kOp, absl::StrCat("pair ", i, " names block ", block));
      if (p.chunks[block >> p.chunk_shift] == nullptr) {
        return Invalid(kOp, absl::StrCat("pair ", i, " names block ", block,
                                         " in released (null) chunk ", block >> p.chunk_shift));
      }
    }
  }
  const int64_t pair_bytes = p.block_bytes * p.num_regions;
  pool.ParallelFor(p.num_pairs, std::max<int64_t>(1, kMinChunkBytes / pair_bytes),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t i = begin; i < end; ++i) {
                       for (int32_t r = 0; r < p.num_regions; ++r) {
                         const int64_t region = int64_t{r} * p.chunk_region_bytes;
                         std::memcpy(
                             BlockAddress(p.chunks, p.chunk_shift, region, p.block_bytes, p.dst[i]),
                             BlockAddress(p.chunks, p.chunk_shift, region, p.block_bytes, p.src[i]),
                             p.block_bytes);
                       }
                     }
                   });
  return absl::OkStatus();
}

}  // namespace kvd
