#include "kernels/cpu_matmul.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#include "kernels/cpu_elementwise.h"
#include "kernels/dtype.h"

namespace kvd {
namespace {

// Each dot product keeps kLanes partial sums (lane l sums k indices = l mod kLanes over
// the largest multiple of kLanes), adds them in a fixed tree, then adds the scalar tail.
// GCC/Clang vector extensions: lowered to whatever SIMD the target function has.
constexpr int kLanes = 8;
typedef float Vec __attribute__((vector_size(kLanes * sizeof(float))));

// Register tile: kTileRows rows of `in` x kTileCols weight rows (output features).
constexpr int kTileRows = 2;
constexpr int kTileCols = 4;
// Parallel work item: kBlockRows x kBlockCols outputs (multiples of the tile).
constexpr int64_t kBlockRows = 32;
constexpr int64_t kBlockCols = 32;
// Multiply-adds a parallel chunk should hold at least, to amortize waking a worker.
constexpr int64_t kMinChunkMacs = int64_t{1} << 17;

// Vectors go through pointers and references only: these helpers are always inlined,
// and a by-value vector would change the ABI between the generic and AVX2 builds.
inline void LoadVec(const float* p, Vec* v) { std::memcpy(v, p, sizeof(*v)); }

inline float ReduceLanes(const Vec& v) {
  return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

struct GemmArgs {
  const float* in;  // [m][in_stride]
  const float* w;   // [n][k]
  float* out;       // [m][n]
  int64_t m, n, k;
  bool accumulate;
  int64_t in_stride;
};

// out[r0 + i][c0 + j] for i < R, j < C.
template <int R, int C>
__attribute__((always_inline)) inline void DotTile(const GemmArgs& a, int64_t r0, int64_t c0) {
  const float* in = a.in + r0 * a.in_stride;
  const float* w = a.w + c0 * a.k;
  Vec acc[R][C];
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < C; ++j) acc[i][j] = Vec{};
  }
  const int64_t k_main = a.k - a.k % kLanes;
  for (int64_t kk = 0; kk < k_main; kk += kLanes) {
    Vec x[R];
    for (int i = 0; i < R; ++i) LoadVec(in + i * a.in_stride + kk, &x[i]);
    for (int j = 0; j < C; ++j) {
      Vec y;
      LoadVec(w + j * a.k + kk, &y);
      for (int i = 0; i < R; ++i) acc[i][j] += x[i] * y;
    }
  }
  for (int i = 0; i < R; ++i) {
    for (int j = 0; j < C; ++j) {
      float tail = 0.0f;
      for (int64_t kk = k_main; kk < a.k; ++kk) {
        tail += in[i * a.in_stride + kk] * w[j * a.k + kk];
      }
      const float dot = ReduceLanes(acc[i][j]) + tail;
      float& o = a.out[(r0 + i) * a.n + c0 + j];
      o = a.accumulate ? o + dot : dot;
    }
  }
}

// Full tiles through DotTile<kTileRows, kTileCols>, edges through smaller instantiations;
// the per-element arithmetic is the same in all of them.
template <int R, int C>
__attribute__((always_inline)) inline void DotEdge(const GemmArgs& a, int64_t r0, int64_t c0,
                                                   int rows, int cols) {
  if constexpr (C > 1) {
    if (cols < C) return DotEdge<R, C - 1>(a, r0, c0, rows, cols);
  }
  if constexpr (R > 1) {
    if (rows < R) return DotEdge<R - 1, C>(a, r0, c0, rows, cols);
  }
  DotTile<R, C>(a, r0, c0);
}

__attribute__((always_inline)) inline void GemmBlockBody(const GemmArgs& a, int64_t row_begin,
                                                         int64_t row_end, int64_t col_begin,
                                                         int64_t col_end) {
  // Weight tile outer: its kTileCols rows stay in cache while the block's rows stream by.
  for (int64_t c = col_begin; c < col_end; c += kTileCols) {
    const int cols = static_cast<int>(std::min<int64_t>(kTileCols, col_end - c));
    for (int64_t r = row_begin; r < row_end; r += kTileRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kTileRows, row_end - r));
      if (rows == kTileRows && cols == kTileCols) {
        DotTile<kTileRows, kTileCols>(a, r, c);
      } else {
        DotEdge<kTileRows, kTileCols>(a, r, c, rows, cols);
      }
    }
  }
}

using GemmBlockFn = void (*)(const GemmArgs&, int64_t, int64_t, int64_t, int64_t);

void GemmBlockGeneric(const GemmArgs& a, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  GemmBlockBody(a, r0, r1, c0, c1);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2,fma"))) void GemmBlockAvx2(const GemmArgs& a, int64_t r0, int64_t r1,
                                                       int64_t c0, int64_t c1) {
  GemmBlockBody(a, r0, r1, c0, c1);
}
#endif

GemmBlockFn PickGemmBlock() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return GemmBlockAvx2;
#endif
  return GemmBlockGeneric;
}

absl::Status Validate(const MatmulParams& p) {
  if (p.weight_dtype != DType::kF32) {
    return absl::UnimplementedError(
        absl::StrCat("Matmul: weight_dtype ", std::string(DTypeName(p.weight_dtype)),
                     " is not supported by the CPU backend (f32 only)"));
  }
  if (p.m < 0 || p.n <= 0 || p.k <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Matmul: m must be >= 0 and n, k positive, got m=", p.m, " n=", p.n, " k=", p.k));
  }
  if (p.m == 0) return absl::OkStatus();
  if (p.out == nullptr || p.weight == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("Matmul: ", p.out == nullptr ? "out" : "weight", " is null"));
  }
  if (absl::Status s = ValidateMatmulPrologue(p); !s.ok()) return s;
  if (p.prologue == MatmulPrologue::kRmsNorm && p.norm_dtype != DType::kF32) {
    return absl::UnimplementedError(
        absl::StrCat("Matmul: norm_dtype ", std::string(DTypeName(p.norm_dtype)),
                     " is not supported by the CPU backend (f32 only)"));
  }
  return absl::OkStatus();
}

// The prologue's rows, [m][k], computed by the CPU backend's own RmsNorm or SiluMul: a fused
// product gives the bits of the two ops run one after the other.
absl::Status RunPrologue(const MatmulParams& p, int64_t in_stride, ThreadPool& pool,
                         std::vector<float>& x) {
  x.resize(static_cast<size_t>(int64_t{p.m} * p.k));
  if (p.prologue == MatmulPrologue::kSiluMul) {
    return CpuSiluMul(MatmulPrologueSiluMul(p, x.data()), pool);
  }
  // RmsNormParams rows are dense: a strided `in` goes a row at a time.
  RmsNormParams norm = MatmulPrologueRmsNorm(p, x.data());
  if (in_stride == p.k) return CpuRmsNorm(norm, pool);
  norm.num_rows = 1;
  for (int64_t r = 0; r < p.m; ++r) {
    norm.out = x.data() + r * p.k;
    norm.in = p.in + r * in_stride;
    if (absl::Status s = CpuRmsNorm(norm, pool); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CpuMatmul(const MatmulParams& p, ThreadPool& pool) {
  if (absl::Status s = Validate(p); !s.ok()) return s;
  if (p.m == 0) return absl::OkStatus();
  // A pure function of the CPU's features, so every call and thread uses the same kernel.
  const GemmBlockFn gemm_block = PickGemmBlock();

  int64_t in_stride = p.in_stride == 0 ? p.k : p.in_stride;
  const float* in = p.in;
  std::vector<float> prologue_rows;
  if (p.prologue != MatmulPrologue::kNone) {
    if (absl::Status s = RunPrologue(p, in_stride, pool, prologue_rows); !s.ok()) return s;
    in = prologue_rows.data();
    in_stride = p.k;
  }
  const GemmArgs a{
      in, static_cast<const float*>(p.weight), p.out, p.m, p.n, p.k, p.accumulate, in_stride};
  const int64_t row_blocks = (a.m + kBlockRows - 1) / kBlockRows;
  const int64_t col_blocks = (a.n + kBlockCols - 1) / kBlockCols;
  const int64_t block_macs = std::min(a.m, kBlockRows) * kBlockCols * a.k;
  const int64_t grain = std::max<int64_t>(1, kMinChunkMacs / block_macs);
  // Row blocks vary fastest, so a chunk of consecutive items shares weight rows.
  pool.ParallelFor(row_blocks * col_blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t rb = item % row_blocks;
      const int64_t cb = item / row_blocks;
      gemm_block(a, rb * kBlockRows, std::min(a.m, (rb + 1) * kBlockRows), cb * kBlockCols,
                 std::min(a.n, (cb + 1) * kBlockCols));
    }
  });
  return absl::OkStatus();
}

}  // namespace kvd
