#include "kernels/cpu_elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "kernels/dtype.h"
#include "kernels/status_macros.h"

namespace kvd {
namespace {

// Elements a parallel chunk of rows should cover at least.
constexpr int64_t kMinChunkElements = int64_t{1} << 14;

int64_t RowGrain(int64_t row_elements) {
  return std::max<int64_t>(1, kMinChunkElements / std::max<int64_t>(1, row_elements));
}

absl::Status Invalid(absl::string_view op, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", what));
}

absl::Status RequirePositive(absl::string_view op, absl::string_view field, int64_t value) {
  if (value > 0) return absl::OkStatus();
  return Invalid(op, absl::StrCat(field, " must be positive, got ", value));
}

absl::Status RequireF32(absl::string_view op, absl::string_view field, DType t) {
  if (t == DType::kF32) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(op, ": ", field, " ", std::string(DTypeName(t)),
                                               " is not supported by the CPU backend (f32 only)"));
}

absl::Status RequireNonNegativeRows(absl::string_view op, absl::string_view field, int64_t rows) {
  if (rows >= 0) return absl::OkStatus();
  return Invalid(op, absl::StrCat(field, " must be >= 0, got ", rows));
}


}  // namespace

absl::Status CpuEmbedding(const EmbeddingParams& p, ThreadPool& pool) {
  constexpr absl::string_view kOp = "Embedding";
  KVD_RETURN_IF_ERROR(RequireF32(kOp, "table_dtype", p.table_dtype));
  KVD_RETURN_IF_ERROR(RequireNonNegativeRows(kOp, "num_tokens", p.num_tokens));
  if (p.num_tokens == 0) return absl::OkStatus();
  KVD_RETURN_IF_ERROR(RequirePositive(kOp, "dim", p.dim));
  KVD_RETURN_IF_ERROR(RequirePositive(kOp, "vocab_size", p.vocab_size));
  KVD_RETURN_IF_ERROR(ValidateEmbedding(p));
  for (int32_t t = 0; t < p.num_tokens; ++t) {
    if (p.token_ids[t] < 0 || p.token_ids[t] >= p.vocab_size) {
      return Invalid(kOp, absl::StrCat("token_ids[", t, "] = ", p.token_ids[t],
                                       " is outside [0, vocab_size=", p.vocab_size, ")"));
    }
  }
  const float* table = static_cast<const float*>(p.table);
  pool.ParallelFor(p.num_tokens, RowGrain(p.dim), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      std::memcpy(p.out + t * p.dim, table + int64_t{p.token_ids[t]} * p.dim,
                  sizeof(float) * p.dim);
    }
  });
  return absl::OkStatus();
}

absl::Status CpuRmsNorm(const RmsNormParams& p, ThreadPool& pool) {
  constexpr absl::string_view kOp = "RmsNorm";
  KVD_RETURN_IF_ERROR(RequireF32(kOp, "weight_dtype", p.weight_dtype));
  KVD_RETURN_IF_ERROR(RequireNonNegativeRows(kOp, "num_rows", p.num_rows));
  if (p.num_rows == 0) return absl::OkStatus();
  KVD_RETURN_IF_ERROR(RequirePositive(kOp, "dim", p.dim));
  KVD_RETURN_IF_ERROR(ValidateRmsNorm(p));
  const float* weight = static_cast<const float*>(p.weight);
  pool.ParallelFor(p.num_rows, RowGrain(p.dim), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* x = p.in + r * p.dim;
      float* o = p.out + r * p.dim;
      float ss = 0.0f;
      for (int32_t i = 0; i < p.dim; ++i) ss += x[i] * x[i];
      ss /= static_cast<float>(p.dim);
      ss += p.eps;
      ss = 1.0f / std::sqrt(ss);
      for (int32_t i = 0; i < p.dim; ++i) o[i] = weight[i] * (ss * x[i]);
    }
  });
  return absl::OkStatus();
}

absl::Status CpuRope(const RopeParams& p, ThreadPool& pool) {
  KVD_RETURN_IF_ERROR(ValidateRope(p));
  if (p.num_tokens == 0) return absl::OkStatus();

  const int32_t half = p.head_dim / 2;
  std::vector<float> freq(half);
  for (int32_t i = 0; i < half; ++i) {
    freq[i] = 1.0f / std::pow(p.theta, static_cast<float>(2 * i) / static_cast<float>(p.head_dim));
  }
  // In-pair element offsets of pair i: (2i, 2i+1) or (i, i+half).
  const bool interleaved = p.style == RopeStyle::kInterleaved;
  const int32_t first_step = interleaved ? 2 : 1;
  const int32_t partner = interleaved ? 1 : half;
  auto rotate_heads = [&](float* row, int32_t num_heads, const float* cos_v, const float* sin_v) {
    for (int32_t h = 0; h < num_heads; ++h) {
      float* x = row + int64_t{h} * p.head_dim;
      for (int32_t i = 0; i < half; ++i) {
        float* a = x + i * first_step;
        const float v0 = a[0];
        const float v1 = a[partner];
        a[0] = v0 * cos_v[i] - v1 * sin_v[i];
        a[partner] = v0 * sin_v[i] + v1 * cos_v[i];
      }
    }
  };
  const int64_t row_elements = int64_t{p.num_q_heads + p.num_kv_heads} * p.head_dim;
  pool.ParallelFor(p.num_tokens, RowGrain(row_elements), [&](int64_t begin, int64_t end) {
    std::vector<float> cos_v(half), sin_v(half);
    for (int64_t t = begin; t < end; ++t) {
      const float pos = static_cast<float>(p.positions[t]);
      for (int32_t i = 0; i < half; ++i) {
        const float val = pos * freq[i];
        cos_v[i] = std::cos(val);
        sin_v[i] = std::sin(val);
      }
      if (p.num_q_heads > 0) {
        float* q = p.q + t * p.q_stride;
        rotate_heads(q, p.num_q_heads, cos_v.data(), sin_v.data());
        if (p.q_bf16 != nullptr) {
          uint16_t* q_bf16 = static_cast<uint16_t*>(p.q_bf16) + t * p.q_bf16_stride;
          for (int64_t i = 0; i < int64_t{p.num_q_heads} * p.head_dim; ++i) {
            q_bf16[i] = Bf16Bits(q[i]);
          }
        }
      }
      if (p.num_kv_heads > 0)
        rotate_heads(p.k + t * p.k_stride, p.num_kv_heads, cos_v.data(), sin_v.data());
    }
  });
  return absl::OkStatus();
}

absl::Status CpuSiluMul(const SiluMulParams& p, ThreadPool& pool) {
  constexpr absl::string_view kOp = "SiluMul";
  KVD_RETURN_IF_ERROR(RequireNonNegativeRows(kOp, "num_rows", p.num_rows));
  if (p.num_rows == 0) return absl::OkStatus();
  KVD_RETURN_IF_ERROR(RequirePositive(kOp, "dim", p.dim));
  KVD_RETURN_IF_ERROR(ValidateSiluMul(p));
  pool.ParallelFor(p.num_rows, RowGrain(p.dim), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* g = p.gate + r * p.gate_stride;
      const float* u = p.up + r * p.up_stride;
      float* o = p.out + r * p.dim;
      for (int32_t i = 0; i < p.dim; ++i) {
        float val = g[i];
        val *= 1.0f / (1.0f + std::exp(-val));
        o[i] = val * u[i];
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace kvd

#undef KVD_RETURN_IF_ERROR
