// LaunchSkinnyGemm, the decode GEMV, against an fp64 host reference computed from the
// bf16-rounded input and the bf16 weights, and against the cuBLAS path of
// CudaBackend::Matmul (F32ToBf16 + BlasGemm) on the same device inputs.
//
// Weights are filled on the device from a counter-based stream (random_fill.h) that the
// host recomputes element by element, so even the 1 GB lm_head shape needs no upload.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/blas_gemm.h"
#include "kernels/cuda/elementwise_kernels.h"
#include "kernels/cuda/gemv_kernels.h"
#include "kernels/cuda/random_fill.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvd::gpu_test {
namespace {

using cuda::kMaxSkinnyRows;
using cuda::LaunchSkinnyGemm;
using cuda::SkinnyGemmSupports;

struct GemvShape {
  int n;
  int k;
};

constexpr uint32_t kPoisonBits = 0xFFFFFFFFu;

uint32_t BitsOf(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

// Output columns the host checks: all of them, or for very wide outputs every 7th plus the
// last 40 (the partial final CTA) to keep the fp64 reference cheap.
std::vector<int> CheckedColumns(int n) {
  std::vector<int> columns;
  const int stride = n > 32768 ? 7 : 1;
  for (int j = 0; j < n; j += stride) columns.push_back(j);
  for (int j = std::max(0, n - 40); j < n; ++j) {
    if (j % stride != 0) columns.push_back(j);
  }
  return columns;
}

// fp64 sums for kMaxSkinnyRows input rows and some output columns; [row][column index].
struct Reference {
  std::vector<int> columns;
  std::vector<double> dot;      // sum_i bf16(x[row][i]) * w[column][i]
  std::vector<double> abs_dot;  // sum_i |bf16(x[row][i]) * w[column][i]|
};

Reference ComputeReference(const std::vector<float>& x, const RandomFill& fill, int n, int k) {
  Reference ref;
  ref.columns = CheckedColumns(n);
  const size_t num_columns = ref.columns.size();
  ref.dot.assign(kMaxSkinnyRows * num_columns, 0.0);
  ref.abs_dot.assign(kMaxSkinnyRows * num_columns, 0.0);
  std::vector<double> x_rounded(x.size());
  for (size_t i = 0; i < x.size(); ++i) x_rounded[i] = RoundBf16(x[i]);
  const int num_threads =
      static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 32u));
  std::vector<std::thread> threads;
  for (int worker = 0; worker < num_threads; ++worker) {
    threads.emplace_back([&, worker] {
      std::vector<double> w(k);
      for (size_t c = worker; c < num_columns; c += num_threads) {
        const uint64_t row_start = uint64_t(ref.columns[c]) * k;
        for (int i = 0; i < k; ++i) w[i] = RoundBf16(RandomFillValue(fill, row_start + i));
        for (int r = 0; r < kMaxSkinnyRows; ++r) {
          const double* xr = &x_rounded[size_t(r) * k];
          double dot = 0.0;
          double abs_dot = 0.0;
          for (int i = 0; i < k; ++i) {
            const double product = xr[i] * w[i];
            dot += product;
            abs_dot += std::abs(product);
          }
          ref.dot[r * num_columns + c] = dot;
          ref.abs_dot[r * num_columns + c] = abs_dot;
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  return ref;
}

// The required accuracy: fp32 accumulation of exact bf16 products, in any order.
double Tolerance(double abs_dot) { return 1e-3 * abs_dot + 1e-6; }

// Checks `actual` ([kMaxSkinnyRows + 1][n] as downloaded) on rows < m and the reference's
// columns against `expected(row, column index)`, within Tolerance.
template <typename Expected>
::testing::AssertionResult WithinTolerance(const std::vector<float>& actual, int m, int n,
                                           const Reference& ref, Expected&& expected) {
  const size_t num_columns = ref.columns.size();
  size_t violations = 0;
  double worst_ratio = -1.0;
  int worst_row = 0;
  size_t worst_c = 0;
  for (int r = 0; r < m; ++r) {
    for (size_t c = 0; c < num_columns; ++c) {
      const double a = actual[size_t(r) * n + ref.columns[c]];
      const double error = std::abs(a - expected(r, c));
      const double ratio =
          std::isnan(a) ? INFINITY : error / Tolerance(ref.abs_dot[r * num_columns + c]);
      if (ratio > 1.0) ++violations;
      if (ratio > worst_ratio) {
        worst_ratio = ratio;
        worst_row = r;
        worst_c = c;
      }
    }
  }
  if (violations == 0) return ::testing::AssertionSuccess();
  const int j = ref.columns[worst_c];
  return ::testing::AssertionFailure()
         << violations << " outputs out of tolerance; worst out[" << worst_row << "][" << j
         << "] = " << actual[size_t(worst_row) * n + j] << ", expected "
         << expected(worst_row, worst_c) << " (allowed error "
         << Tolerance(ref.abs_dot[worst_row * num_columns + worst_c]) << ")";
}

// Rows < m hold numbers in every column (the sampled check would miss a skipped column);
// rows >= m still hold the poison.
::testing::AssertionResult WroteExactlyRowsBelowM(const std::vector<float>& actual, int m, int n) {
  for (size_t i = 0; i < actual.size(); ++i) {
    const bool inside = i < size_t(m) * n;
    if (inside && std::isnan(actual[i])) {
      return ::testing::AssertionFailure() << "out[" << i / n << "][" << i % n << "] is NaN";
    }
    if (!inside && BitsOf(actual[i]) != kPoisonBits) {
      return ::testing::AssertionFailure()
             << "out[" << i / n << "][" << i % n << "] written although row >= m = " << m;
    }
  }
  return ::testing::AssertionSuccess();
}

class SkinnyGemmTest : public GpuVsCpuTest {
 protected:
  // An output of kMaxSkinnyRows + 1 rows: rows < m hold `residual` when accumulating, every
  // other element the poison.
  DeviceBuffer Output(int m, int n, bool accumulate, const std::vector<float>& residual) {
    std::vector<float> init(size_t(kMaxSkinnyRows + 1) * n);
    const float poison = [] {
      float f;
      std::memcpy(&f, &kPoisonBits, sizeof(f));
      return f;
    }();
    std::fill(init.begin(), init.end(), poison);
    if (accumulate) std::copy(residual.begin(), residual.begin() + size_t(m) * n, init.begin());
    return Upload(gpu(), init);
  }

  // The `count` fp32 values at x rounded to bf16 (nearest even), in a new buffer.
  DeviceBuffer Bf16Copy(const DeviceBuffer& x, size_t count) {
    DeviceBuffer out = OrDie(gpu().Allocate(count * 2), "Allocate");
    const cudaError_t err =
        cuda::LaunchF32ToBf16(out.data(), x.as<float>(), int64_t(count), gpu().stream());
    EXPECT_EQ(err, cudaSuccess) << cudaGetErrorString(err);
    return out;
  }

  // The fill of a bf16 [n][k] weight from stream `seed` (the host recomputes its values).
  static RandomFill WeightFill(const GemvShape& s, uint64_t seed) {
    return RandomFill{RandomFillKey(seed, uint64_t(s.n) * 100003 + s.k), 1.0f, 0.0f};
  }
  DeviceBuffer Weight(const GemvShape& s, const RandomFill& fill) {
    const size_t weight_count = size_t(s.n) * s.k;
    DeviceBuffer weight = OrDie(gpu().Allocate(weight_count * 2), "Allocate");
    OrDie(gpu().FillRandom(weight.data(), DType::kBF16, weight_count, fill), "FillRandom");
    return weight;
  }

  // Every m in 1..kMaxSkinnyRows, accumulate off and on, on one weight and one input.
  void CheckShape(const GemvShape& s) {
    SCOPED_TRACE(testing::Message() << "n " << s.n << " k " << s.k);
    ASSERT_TRUE(SkinnyGemmSupports(nullptr, nullptr, nullptr, 1, s.n, s.k));
    const RandomFill fill = WeightFill(s, 11);
    DeviceBuffer weight = Weight(s, fill);
    // Unrounded fp32 input: the kernel must round it to bf16 itself.
    const std::vector<float> x = RandomFloats(size_t(kMaxSkinnyRows) * s.k, s.n + 7 * s.k);
    DeviceBuffer x_dev = Upload(gpu(), x);
    DeviceBuffer x_bf16 = OrDie(gpu().Allocate(x.size() * 2), "Allocate");
    const std::vector<float> residual =
        RandomFloats(size_t(kMaxSkinnyRows) * s.n, s.n + 3, -4.0f, 4.0f);
    const Reference ref = ComputeReference(x, fill, s.n, s.k);
    const size_t num_columns = ref.columns.size();
    std::unique_ptr<BlasGemm> blas = OrDie(BlasGemm::Create(gpu().stream()), "BlasGemm");

    for (int m = 1; m <= kMaxSkinnyRows; ++m) {
      for (const bool accumulate : {false, true}) {
        SCOPED_TRACE(testing::Message() << "m " << m << (accumulate ? " accumulate" : ""));
        DeviceBuffer out = Output(m, s.n, accumulate, residual);
        DeviceBuffer blas_out = Output(m, s.n, accumulate, residual);
        ASSERT_EQ(LaunchSkinnyGemm(out.as<float>(), x_dev.as<float>(), weight.data(), m, s.n, s.k,
                                   accumulate, gpu().stream()),
                  cudaSuccess);
        ASSERT_EQ(cuda::LaunchF32ToBf16(x_bf16.data(), x_dev.as<float>(), int64_t{m} * s.k,
                                        gpu().stream()),
                  cudaSuccess);
        const absl::Status status =
            blas->Run(blas_out.as<float>(), x_bf16.data(), weight.data(), m, s.n, s.k, accumulate);
        ASSERT_TRUE(status.ok()) << status;
        const size_t out_count = size_t(kMaxSkinnyRows + 1) * s.n;
        const std::vector<float> got = DownloadFloats(gpu(), out.data(), out_count);
        const std::vector<float> cublas = DownloadFloats(gpu(), blas_out.data(), out_count);

        EXPECT_TRUE(WroteExactlyRowsBelowM(got, m, s.n));
        EXPECT_TRUE(WithinTolerance(got, m, s.n, ref, [&](int r, size_t c) {
          const double base = accumulate ? residual[size_t(r) * s.n + ref.columns[c]] : 0.0;
          return base + ref.dot[r * num_columns + c];
        })) << "against the fp64 reference";
        EXPECT_TRUE(WithinTolerance(got, m, s.n, ref, [&](int r, size_t c) {
          return double{cublas[size_t(r) * s.n + ref.columns[c]]};
        })) << "against cuBLAS";
      }
    }
  }
};

TEST_F(SkinnyGemmTest, MatchesReferenceOnLlama3_8bShapes) {
  // q/k/v fused, o, gate/up fused, down, lm_head.
  for (const GemvShape& s : {GemvShape{6144, 4096}, GemvShape{4096, 4096}, GemvShape{28672, 4096},
                             GemvShape{4096, 14336}, GemvShape{128256, 4096}}) {
    CheckShape(s);
  }
}

TEST_F(SkinnyGemmTest, MatchesReferenceOnOddShapes) {
  // Single columns, k of one or three 16-byte pieces, k not a multiple of the 32-wide step,
  // n not a multiple of the CTA's rows; 8200 and 16400 end in a partial CTA of the 32- and
  // the 64-row variants.
  for (const GemvShape& s :
       {GemvShape{1, 8}, GemvShape{3, 24}, GemvShape{1, 24}, GemvShape{3, 8}, GemvShape{17, 264},
        GemvShape{100, 1000}, GemvShape{8200, 40}, GemvShape{16400, 24}}) {
    CheckShape(s);
  }
}

// Every launch shape (the launcher's choice and the ones gpu_bench compares it with) computes
// the product, on shapes that end in partial CTAs of each.
TEST_F(SkinnyGemmTest, EveryLaunchShapeMatchesTheReference) {
  using cuda::SkinnyGemmShape;
  for (const GemvShape& s : {GemvShape{17, 264}, GemvShape{100, 1000}, GemvShape{8200, 40}}) {
    SCOPED_TRACE(testing::Message() << "n " << s.n << " k " << s.k);
    const RandomFill fill = WeightFill(s, 13);
    DeviceBuffer weight = Weight(s, fill);
    const std::vector<float> x = RandomFloats(size_t(kMaxSkinnyRows) * s.k, s.n + 11 * s.k);
    DeviceBuffer x_dev = Upload(gpu(), x);
    const std::vector<float> residual =
        RandomFloats(size_t(kMaxSkinnyRows) * s.n, s.n + 5, -4.0f, 4.0f);
    const Reference ref = ComputeReference(x, fill, s.n, s.k);
    const size_t num_columns = ref.columns.size();
    for (const SkinnyGemmShape shape :
         {SkinnyGemmShape::kOneTile, SkinnyGemmShape::kOneTileThreeCtas, SkinnyGemmShape::kTwoTiles,
          SkinnyGemmShape::kFourTiles}) {
      for (const int m : {1, 3, kMaxSkinnyRows}) {
        SCOPED_TRACE(testing::Message() << "shape " << static_cast<int>(shape) << " m " << m);
        DeviceBuffer out = Output(m, s.n, /*accumulate=*/true, residual);
        ASSERT_EQ(cuda::LaunchSkinnyGemmShape(shape, out.as<float>(), x_dev.as<float>(),
                                              weight.data(), m, s.n, s.k, true, gpu().stream()),
                  cudaSuccess);
        const std::vector<float> got =
            DownloadFloats(gpu(), out.data(), size_t(kMaxSkinnyRows + 1) * s.n);
        EXPECT_TRUE(WroteExactlyRowsBelowM(got, m, s.n));
        EXPECT_TRUE(WithinTolerance(got, m, s.n, ref, [&](int r, size_t c) {
          return residual[size_t(r) * s.n + ref.columns[c]] + ref.dot[r * num_columns + c];
        }));
      }
    }
  }
}

// Input rows given in bf16 (a Matmul prologue's, LaunchSkinnyGemmShapeBf16Input) give the bits
// that the fp32 rows they round give: the same products summed in the same order, in every
// launch shape, accumulating or not.
TEST_F(SkinnyGemmTest, Bf16InputRowsGiveTheBitsOfTheirFp32Rows) {
  using cuda::SkinnyGemmShape;
  for (const GemvShape& s :
       {GemvShape{17, 264}, GemvShape{100, 1000}, GemvShape{8200, 40}, GemvShape{4096, 14336}}) {
    SCOPED_TRACE(testing::Message() << "n " << s.n << " k " << s.k);
    DeviceBuffer weight = Weight(s, WeightFill(s, 17));
    const std::vector<float> x = RandomFloats(size_t(kMaxSkinnyRows) * s.k, s.n + 13 * s.k);
    DeviceBuffer x_dev = Upload(gpu(), x);
    DeviceBuffer x_bf16 = Bf16Copy(x_dev, x.size());
    const std::vector<float> residual =
        RandomFloats(size_t(kMaxSkinnyRows) * s.n, s.n + 9, -4.0f, 4.0f);
    ASSERT_TRUE(cuda::SkinnyGemmSupportsBf16Input(nullptr, nullptr, nullptr, 1, s.n, s.k));
    for (const SkinnyGemmShape shape :
         {SkinnyGemmShape::kOneTile, SkinnyGemmShape::kOneTileThreeCtas, SkinnyGemmShape::kTwoTiles,
          SkinnyGemmShape::kFourTiles}) {
      for (const int m : {1, 3, kMaxSkinnyRows}) {
        for (const bool accumulate : {false, true}) {
          SCOPED_TRACE(testing::Message() << "shape " << static_cast<int>(shape) << " m " << m
                                          << (accumulate ? " accumulate" : ""));
          DeviceBuffer from_f32 = Output(m, s.n, accumulate, residual);
          DeviceBuffer from_bf16 = Output(m, s.n, accumulate, residual);
          ASSERT_EQ(
              cuda::LaunchSkinnyGemmShape(shape, from_f32.as<float>(), x_dev.as<float>(),
                                          weight.data(), m, s.n, s.k, accumulate, gpu().stream()),
              cudaSuccess);
          ASSERT_EQ(cuda::LaunchSkinnyGemmShapeBf16Input(shape, from_bf16.as<float>(),
                                                         x_bf16.data(), weight.data(), m, s.n, s.k,
                                                         accumulate, gpu().stream()),
                    cudaSuccess);
          const size_t bytes = size_t(kMaxSkinnyRows + 1) * s.n * 4;
          EXPECT_TRUE(DownloadBytes(gpu(), from_f32.data(), bytes) ==
                      DownloadBytes(gpu(), from_bf16.data(), bytes));
        }
      }
    }
  }
  // The chosen shape, as the backend launches it.
  const GemvShape s{6144, 4096};
  DeviceBuffer weight = Weight(s, WeightFill(s, 19));
  const std::vector<float> x = RandomFloats(size_t(kMaxSkinnyRows) * s.k, 23);
  DeviceBuffer x_dev = Upload(gpu(), x);
  DeviceBuffer x_bf16 = Bf16Copy(x_dev, x.size());
  DeviceBuffer from_f32 = Output(2, s.n, false, {});
  DeviceBuffer from_bf16 = Output(2, s.n, false, {});
  ASSERT_EQ(LaunchSkinnyGemm(from_f32.as<float>(), x_dev.as<float>(), weight.data(), 2, s.n, s.k,
                             false, gpu().stream()),
            cudaSuccess);
  ASSERT_EQ(cuda::LaunchSkinnyGemmBf16Input(from_bf16.as<float>(), x_bf16.data(), weight.data(), 2,
                                            s.n, s.k, false, gpu().stream()),
            cudaSuccess);
  const size_t bytes = size_t(kMaxSkinnyRows + 1) * s.n * 4;
  EXPECT_TRUE(DownloadBytes(gpu(), from_f32.data(), bytes) ==
              DownloadBytes(gpu(), from_bf16.data(), bytes));
}

// With an identity weight, out[r][j] is exactly bf16(x[r][j]): checks the rounding (nearest,
// ties to even, both signs) and that every output lands in its own (row, column).
TEST_F(SkinnyGemmTest, IdentityWeightGivesTheInputRoundedToNearestEven) {
  constexpr int kDim = 40;  // two CTAs of columns; k of one full and one partial step
  std::vector<float> identity(kDim * kDim, 0.0f);
  for (int j = 0; j < kDim; ++j) identity[j * kDim + j] = 1.0f;
  DeviceBuffer weight = OrDie(gpu().UploadWeights(identity.data(), identity.size()), "upload");

  std::vector<float> x = RandomFloats(kMaxSkinnyRows * kDim, 5, -3.0f, 3.0f);
  const float ulp = std::ldexp(1.0f, -7);  // bf16 spacing in [1, 2)
  const float crafted[] = {
      1.0f + ulp / 2,                             // tie, rounds down to the even 1.0
      1.0f + 3 * ulp / 2,                         // tie, rounds up to the even 1 + 2 ulp
      1.0f + ulp / 2 + std::ldexp(1.0f, -20),     // just above a tie: up
      -(1.0f + 3 * ulp / 2),                      // negative tie, to the even -(1 + 2 ulp)
      -(1.0f + ulp / 2 - std::ldexp(1.0f, -20)),  // just below a tie: toward zero
      1.5e-30f,
      65504.7f,
      -1.0e-5f};
  std::copy(std::begin(crafted), std::end(crafted), x.begin());
  std::copy(std::begin(crafted), std::end(crafted), x.begin() + 7 * kDim + 30);
  DeviceBuffer x_dev = Upload(gpu(), x);
  const std::vector<float> residual = RandomFloats(kMaxSkinnyRows * kDim, 6, -4.0f, 4.0f);

  for (const bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
    DeviceBuffer out =
        accumulate ? Upload(gpu(), residual) : Poisoned(gpu(), residual.size() * sizeof(float));
    ASSERT_EQ(LaunchSkinnyGemm(out.as<float>(), x_dev.as<float>(), weight.data(), kMaxSkinnyRows,
                               kDim, kDim, accumulate, gpu().stream()),
              cudaSuccess);
    const std::vector<float> got = DownloadFloats(gpu(), out.data(), residual.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const float rounded = RoundBf16(x[i]);
      const float want = accumulate ? residual[i] + rounded : rounded;
      ASSERT_EQ(BitsOf(got[i]), BitsOf(want))
          << "out[" << i / kDim << "][" << i % kDim << "] = " << got[i] << " for x " << x[i]
          << ", expected " << want;
    }
  }
}

// The summation order is fixed, so a replayed graph and a second eager call reproduce the
// first call bit for bit; the launch records into a graph without any host synchronization.
TEST_F(SkinnyGemmTest, DeterministicAndReplayableFromACudaGraph) {
  constexpr int kM = 3, kN = 6144, kK = 4096;
  DeviceBuffer weight = OrDie(gpu().Allocate(size_t(kN) * kK * 2), "Allocate");
  OrDie(gpu().FillRandom(weight.data(), DType::kBF16, size_t(kN) * kK, RandomFill{42, 1.0f, 0.0f}),
        "FillRandom");
  DeviceBuffer x = Upload(gpu(), RandomFloats(size_t(kM) * kK, 8));
  const size_t out_bytes = size_t(kM) * kN * sizeof(float);
  DeviceBuffer eager = Poisoned(gpu(), out_bytes);
  DeviceBuffer again = Poisoned(gpu(), out_bytes);
  DeviceBuffer replayed = Poisoned(gpu(), out_bytes);
  for (DeviceBuffer* out : {&eager, &again}) {
    ASSERT_EQ(LaunchSkinnyGemm(out->as<float>(), x.as<float>(), weight.data(), kM, kN, kK, false,
                               gpu().stream()),
              cudaSuccess);
  }
  ASSERT_TRUE(gpu().BeginCapture().ok());
  const cudaError_t launched = LaunchSkinnyGemm(replayed.as<float>(), x.as<float>(), weight.data(),
                                                kM, kN, kK, false, gpu().stream());
  absl::StatusOr<CudaBackend::Graph> graph = gpu().EndCapture();
  ASSERT_EQ(launched, cudaSuccess);
  ASSERT_TRUE(graph.ok()) << graph.status();
  ASSERT_TRUE(gpu().LaunchGraph(*graph).ok());

  const std::vector<uint8_t> first = DownloadBytes(gpu(), eager.data(), out_bytes);
  EXPECT_TRUE(first == DownloadBytes(gpu(), again.data(), out_bytes)) << "second eager call";
  EXPECT_TRUE(first == DownloadBytes(gpu(), replayed.data(), out_bytes)) << "graph replay";
  std::vector<float> values(kM * kN);
  std::memcpy(values.data(), first.data(), out_bytes);
  EXPECT_TRUE(std::none_of(values.begin(), values.end(), [](float v) { return std::isnan(v); }));
}

// Host-only: no device needed, nothing is launched.
TEST(SkinnyGemmShapeTest, OneTileUpToTwoCtasAnSmThenThreeCtasOrTwoTiles) {
  using cuda::ChooseSkinnyGemmShape;
  using cuda::SkinnyGemmShape;
  for (const int m : {1, 2, kMaxSkinnyRows}) {
    SCOPED_TRACE(testing::Message() << "m " << m);
    // The 4096-row projections (attention output, FFN down): 256 CTAs, two an SM.
    EXPECT_EQ(ChooseSkinnyGemmShape(m, 4096), SkinnyGemmShape::kOneTile);
    EXPECT_EQ(ChooseSkinnyGemmShape(m, 4224), SkinnyGemmShape::kOneTile);
    // q/k/v (6144): 384 CTAs, three an SM.
    EXPECT_EQ(ChooseSkinnyGemmShape(m, 4225), SkinnyGemmShape::kOneTileThreeCtas);
    EXPECT_EQ(ChooseSkinnyGemmShape(m, 6144), SkinnyGemmShape::kOneTileThreeCtas);
    EXPECT_EQ(ChooseSkinnyGemmShape(m, 16383), SkinnyGemmShape::kOneTileThreeCtas);
  }
  // FFN gate/up and lm_head: single tiles for one row, pairs for more.
  EXPECT_EQ(ChooseSkinnyGemmShape(1, 28672), SkinnyGemmShape::kOneTileThreeCtas);
  EXPECT_EQ(ChooseSkinnyGemmShape(1, 128256), SkinnyGemmShape::kOneTileThreeCtas);
  EXPECT_EQ(ChooseSkinnyGemmShape(2, 16384), SkinnyGemmShape::kTwoTiles);
  EXPECT_EQ(ChooseSkinnyGemmShape(kMaxSkinnyRows, 128256), SkinnyGemmShape::kTwoTiles);
}

TEST(SkinnyGemmSupportsTest, NamesWhatTheKernelCannotRun) {
  const auto at = [](uintptr_t address) { return reinterpret_cast<float*>(address); };
  const void* weight = at(0x10000);
  EXPECT_TRUE(SkinnyGemmSupports(at(0x20000), at(0x30000), weight, 1, 4096, 4096));
  EXPECT_TRUE(SkinnyGemmSupports(at(0x20004), at(0x30010), weight, kMaxSkinnyRows, 1, 8));
  EXPECT_FALSE(SkinnyGemmSupports(at(0x20000), at(0x30000), weight, 0, 4096, 4096));
  EXPECT_FALSE(
      SkinnyGemmSupports(at(0x20000), at(0x30000), weight, kMaxSkinnyRows + 1, 4096, 4096));
  EXPECT_FALSE(SkinnyGemmSupports(at(0x20000), at(0x30000), weight, 1, 0, 4096));
  EXPECT_FALSE(SkinnyGemmSupports(at(0x20000), at(0x30000), weight, 1, 4096, 0));
  EXPECT_FALSE(SkinnyGemmSupports(at(0x20000), at(0x30000), weight, 1, 4096, 4100));  // k % 8
  EXPECT_FALSE(SkinnyGemmSupports(at(0x20000), at(0x30008), weight, 1, 4096, 4096));  // in
  EXPECT_FALSE(SkinnyGemmSupports(at(0x20000), at(0x30000), at(0x10008), 1, 4096, 4096));
  EXPECT_FALSE(SkinnyGemmSupports(at(0x20002), at(0x30000), weight, 1, 4096, 4096));  // out
  // Refused before any CUDA call, so this runs without a device too.
  EXPECT_EQ(LaunchSkinnyGemm(at(0x20000), at(0x30000), weight, 9, 4096, 4096, false, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(cuda::LaunchSkinnyGemmShape(cuda::SkinnyGemmShape::kTwoTiles, at(0x20000), at(0x30000),
                                        weight, 9, 4096, 4096, false, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kvd::gpu_test
