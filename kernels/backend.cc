#include "kernels/backend.h"

#include <cstdint>
#include <tuple>

#include "absl/strings/str_cat.h"

namespace kvd {

DeviceBuffer::DeviceBuffer(Backend* backend, void* data, size_t bytes)
    : backend_(backend), data_(data), bytes_(bytes) {
  if (backend_ != nullptr && data_ != nullptr) {
    backend_->allocated_bytes_.fetch_add(static_cast<int64_t>(bytes_), std::memory_order_relaxed);
  }
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    backend_ = other.backend_;
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.backend_ = nullptr;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

absl::Status ValidateRope(const RopeParams& p) {
  auto invalid = [](auto&&... what) {
    return absl::InvalidArgumentError(absl::StrCat("Rope: ", what...));
  };
  if (p.num_tokens < 0) return invalid("num_tokens must be >= 0, got ", p.num_tokens);
  if (p.num_tokens == 0) return absl::OkStatus();
  if (p.head_dim <= 0) return invalid("head_dim must be positive, got ", p.head_dim);
  if (p.head_dim % 2 != 0) return invalid("head_dim ", p.head_dim, " is odd");
  if (p.num_q_heads < 0 || p.num_kv_heads < 0 || p.num_q_heads + p.num_kv_heads == 0) {
    return invalid("num_q_heads (", p.num_q_heads, ") and num_kv_heads (", p.num_kv_heads,
                   ") must be >= 0, not both 0");
  }
  if (!(p.theta > 0.0f)) return invalid("theta must be positive, got ", p.theta);
  if (p.style != RopeStyle::kInterleaved && p.style != RopeStyle::kHalf) {
    return invalid("style ", static_cast<int32_t>(p.style), " is unknown");
  }
  if (p.positions == nullptr) return invalid("positions is null");
  const int64_t q_width = int64_t{p.num_q_heads} * p.head_dim;
  const int64_t k_width = int64_t{p.num_kv_heads} * p.head_dim;
  if (p.num_q_heads > 0) {
    if (p.q == nullptr) return invalid("q is null");
    if (p.q_stride < q_width) {
      return invalid("q_stride ", p.q_stride, " < num_q_heads * head_dim (", q_width, ")");
    }
  }
  if (p.num_kv_heads > 0) {
    if (p.k == nullptr) return invalid("k is null");
    if (p.k_stride < k_width) {
      return invalid("k_stride ", p.k_stride, " < num_kv_heads * head_dim (", k_width, ")");
    }
  }
  if (p.q_bf16 != nullptr && p.q_bf16_stride < q_width) {
    return invalid("q_bf16_stride ", p.q_bf16_stride, " < num_q_heads * head_dim (", q_width, ")");
  }
  return ValidateRopeAppend(p);
}

absl::Status ValidateRopeAppend(const RopeParams& p) {
  if (!p.append_kv || p.num_tokens <= 0) return absl::OkStatus();
  if (p.cache.num_kv_heads != p.num_kv_heads || p.cache.head_dim != p.head_dim) {
    return absl::InvalidArgumentError(
        absl::StrCat("Rope: append_kv cache has ", p.cache.num_kv_heads, " KV heads of head_dim ",
                     p.cache.head_dim, ", the op ", p.num_kv_heads, " of ", p.head_dim));
  }
  if (p.k == nullptr || p.v == nullptr || p.slot_mapping == nullptr) {
    return absl::InvalidArgumentError("Rope: append_kv needs k, v and slot_mapping");
  }
  const int64_t width = int64_t{p.num_kv_heads} * p.head_dim;
  if (p.k_stride < width || p.v_stride < width) {
    return absl::InvalidArgumentError(
        absl::StrCat("Rope: append_kv k_stride ", p.k_stride, " and v_stride ", p.v_stride,
                     " must be >= ", width, " (num_kv_heads * head_dim)"));
  }
  return absl::OkStatus();
}

AppendKvParams RopeAppendParams(const RopeParams& p) {
  return {.cache = p.cache,
          .k = p.k,
          .v = p.v,
          .slot_mapping = p.slot_mapping,
          .num_tokens = p.num_tokens,
          .k_stride = p.k_stride,
          .v_stride = p.v_stride};
}

absl::Status ValidateKvScales(absl::string_view op, const KvCacheView& view) {
  if (view.dtype != DType::kInt8) return absl::OkStatus();
  // Each factor is below 2^31; the products may pass 2^63.
  int64_t data_bytes = 0, scale_bytes = 0, scales_end = 0;
  const int64_t heads_x_tokens = int64_t{view.num_kv_heads} * view.block_size;
  const bool overflow =
      __builtin_mul_overflow(heads_x_tokens, int64_t{view.head_dim}, &data_bytes) ||
      __builtin_mul_overflow(heads_x_tokens, int64_t{4}, &scale_bytes) ||
      __builtin_add_overflow(view.scale_offset_bytes, scale_bytes, &scales_end);
  // The block's slots, and so its scales, stay 4-byte aligned only with these multiples of 4.
  const bool aligned = view.scale_offset_bytes % 4 == 0 && view.block_bytes % 4 == 0 &&
                       view.k_offset_bytes % 4 == 0 && view.v_offset_bytes % 4 == 0;
  if (overflow || !aligned || view.scale_offset_bytes < data_bytes ||
      scales_end > view.block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": cache.scale_offset_bytes (", view.scale_offset_bytes,
        ") must put the int8 block's num_kv_heads * block_size fp32 scales, 4-byte aligned, after "
        "its ",
        overflow ? std::string("(past int64)") : absl::StrCat(data_bytes),
        " bytes of elements and inside its block_bytes (", view.block_bytes,
        "), with block_bytes, k_offset_bytes (", view.k_offset_bytes, ") and v_offset_bytes (",
        view.v_offset_bytes, ") multiples of 4"));
  }
  return absl::OkStatus();
}

absl::Status ValidateAppendKvRows(const AppendKvParams& p) {
  auto invalid = [](auto&&... what) {
    return absl::InvalidArgumentError(absl::StrCat("AppendKv: ", what...));
  };
  if (p.num_tokens < 0) return invalid("num_tokens ", p.num_tokens, " is negative");
  if (p.num_tokens == 0) return absl::OkStatus();
  if (p.k == nullptr) return invalid("k is null");
  if (p.v == nullptr) return invalid("v is null");
  if (p.slot_mapping == nullptr) return invalid("slot_mapping is null");
  const int64_t width = int64_t{p.cache.num_kv_heads} * p.cache.head_dim;
  if (p.k_stride < width || p.v_stride < width) {
    return invalid("k_stride (", p.k_stride, ") and v_stride (", p.v_stride,
                   ") must be >= num_kv_heads * head_dim (", width, ")");
  }
  return absl::OkStatus();
}

namespace {

// [begin, end) of `rows` rows of `width` floats, `stride` apart, as addresses.
struct FloatSpan {
  uintptr_t begin;
  uintptr_t end;
};

FloatSpan RowsSpan(const float* base, int32_t rows, int32_t width, int32_t stride) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(base);
  const int64_t floats = int64_t{rows - 1} * stride + width;
  return {begin, begin + static_cast<uintptr_t>(floats) * sizeof(float)};
}

bool Overlap(FloatSpan a, FloatSpan b) { return a.begin < b.end && b.begin < a.end; }

}  // namespace

absl::Status ValidateMatmulPrologue(const MatmulParams& p) {
  auto invalid = [](auto&&... what) {
    return absl::InvalidArgumentError(absl::StrCat("Matmul: ", what...));
  };
  if (p.in == nullptr) return invalid("in is null");
  if (p.in_stride != 0 && p.in_stride < p.k) {
    return invalid("in_stride ", p.in_stride, " < k (", p.k, "); 0 means k");
  }
  const bool norm = p.prologue == MatmulPrologue::kRmsNorm;
  const bool silu = p.prologue == MatmulPrologue::kSiluMul;
  if (!norm && !silu && p.prologue != MatmulPrologue::kNone) {
    return invalid("unknown prologue ", static_cast<int32_t>(p.prologue));
  }
  if (norm && p.norm_weight == nullptr) return invalid("prologue kRmsNorm without norm_weight");
  if (norm && !(p.norm_eps >= 0.0f)) return invalid("norm_eps ", p.norm_eps, " < 0");
  if (!norm && p.norm_weight != nullptr) return invalid("norm_weight given without kRmsNorm");
  if (silu && p.up == nullptr) return invalid("prologue kSiluMul without up");
  if (!silu && p.up != nullptr) return invalid("up given without kSiluMul");
  if (p.up_stride != 0 && p.up_stride < p.k) {
    return invalid("up_stride ", p.up_stride, " < k (", p.k, "); 0 means k");
  }
  return absl::OkStatus();
}

RmsNormParams MatmulPrologueRmsNorm(const MatmulParams& p, float* out) {
  return {.out = out,
          .in = p.in,
          .weight = p.norm_weight,
          .weight_dtype = p.norm_dtype,
          .num_rows = p.m,
          .dim = p.k,
          .eps = p.norm_eps};
}

SiluMulParams MatmulPrologueSiluMul(const MatmulParams& p, float* out) {
  return {.out = out,
          .gate = p.in,
          .up = p.up,
          .num_rows = p.m,
          .dim = p.k,
          .gate_stride = p.in_stride == 0 ? p.k : p.in_stride,
          .up_stride = p.up_stride == 0 ? p.k : p.up_stride};
}

absl::Status ValidateEmbedding(const EmbeddingParams& p) {
  if (p.out == nullptr) return absl::InvalidArgumentError("Embedding: out is null");
  if (p.table == nullptr) return absl::InvalidArgumentError("Embedding: table is null");
  if (p.token_ids == nullptr) return absl::InvalidArgumentError("Embedding: token_ids is null");
  return absl::OkStatus();
}

absl::Status ValidateRmsNorm(const RmsNormParams& p) {
  if (p.out == nullptr) return absl::InvalidArgumentError("RmsNorm: out is null");
  if (p.in == nullptr) return absl::InvalidArgumentError("RmsNorm: in is null");
  if (p.weight == nullptr) return absl::InvalidArgumentError("RmsNorm: weight is null");
  return absl::OkStatus();
}

absl::Status ValidateSiluMul(const SiluMulParams& p) {
  if (p.out == nullptr) return absl::InvalidArgumentError("SiluMul: out is null");
  if (p.gate == nullptr) return absl::InvalidArgumentError("SiluMul: gate is null");
  if (p.up == nullptr) return absl::InvalidArgumentError("SiluMul: up is null");
  if (p.gate_stride < p.dim || p.up_stride < p.dim) {
    return absl::InvalidArgumentError(absl::StrCat("SiluMul: gate_stride (", p.gate_stride,
                                                   ") and up_stride (", p.up_stride,
                                                   ") must be >= dim (", p.dim, ")"));
  }
  const FloatSpan out = RowsSpan(p.out, p.num_rows, p.dim, p.dim);
  for (const auto& [name, input, stride] :
       {std::tuple<const char*, const float*, int32_t>{"gate", p.gate, p.gate_stride},
        {"up", p.up, p.up_stride}}) {
    const bool row_for_row = input == p.out && stride == p.dim;
    if (!row_for_row && Overlap(out, RowsSpan(input, p.num_rows, p.dim, stride))) {
      return absl::InvalidArgumentError(
          absl::StrCat("SiluMul: out overlaps ", name, " other than as the same rows (", name,
                       "_stride ", stride, ", dim ", p.dim, "): out may be ", name,
                       " itself only when ", name, "_stride == dim"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidatePagedAttentionArgs(const PagedAttentionParams& p) {
  auto invalid = [](auto&&... what) {
    return absl::InvalidArgumentError(absl::StrCat("PagedAttention: ", what...));
  };
  if (p.out == nullptr) return invalid("out is null");
  if (p.q == nullptr) return invalid("q is null");
  if (p.q_indptr == nullptr) return invalid("q_indptr is null");
  if (p.blocks.indptr == nullptr) return invalid("blocks.indptr is null");
  if (p.blocks.indices == nullptr) return invalid("blocks.indices is null");
  if (p.blocks.last_block_len == nullptr) return invalid("blocks.last_block_len is null");
  if (p.num_q_heads <= 0 || p.cache.num_kv_heads <= 0 ||
      p.num_q_heads % p.cache.num_kv_heads != 0) {
    return invalid("num_q_heads ", p.num_q_heads,
                   " is not a positive multiple of cache.num_kv_heads ", p.cache.num_kv_heads);
  }
  const int64_t row = int64_t{p.num_q_heads} * p.cache.head_dim;
  if (p.q_stride < row || p.out_stride < row) {
    return invalid("q_stride ", p.q_stride, ", out_stride ", p.out_stride,
                   ": each must be >= num_q_heads * head_dim = ", row);
  }
  if (p.max_q_len < 0) return invalid("max_q_len is ", p.max_q_len, ", not >= 0");
  if (p.max_kv_len < 0) return invalid("max_kv_len is ", p.max_kv_len, ", not >= 0");
  return absl::OkStatus();
}

absl::Status ValidateCopyBlocks(const CopyBlocksParams& p) {
  auto invalid = [](auto&&... what) {
    return absl::InvalidArgumentError(absl::StrCat("CopyBlocks: ", what...));
  };
  if (p.num_pairs < 0) return invalid("num_pairs is ", p.num_pairs);
  if (p.chunks == nullptr) return invalid("chunks is null");
  if (p.src == nullptr) return invalid("src is null");
  if (p.dst == nullptr) return invalid("dst is null");
  if (p.num_regions <= 0 || p.block_bytes <= 0) {
    return invalid("num_regions (", p.num_regions, ") and block_bytes (", p.block_bytes,
                   ") must be positive");
  }
  if (p.chunk_shift < 0 || p.chunk_shift > 30) {
    return invalid("chunk_shift must be in [0, 30], got ", p.chunk_shift);
  }
  // Shifted right, not left: block_bytes << chunk_shift can wrap past int64.
  if ((p.chunk_region_bytes >> p.chunk_shift) < p.block_bytes) {
    return invalid("chunk_region_bytes (", p.chunk_region_bytes,
                   ") cannot hold 1 << chunk_shift blocks of block_bytes (", p.block_bytes, ")");
  }
  return absl::OkStatus();
}

void DeviceBuffer::Reset() {
  if (backend_ != nullptr && data_ != nullptr) {
    backend_->allocated_bytes_.fetch_sub(static_cast<int64_t>(bytes_), std::memory_order_relaxed);
    backend_->Free(data_, bytes_);
  }
  backend_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace kvd
