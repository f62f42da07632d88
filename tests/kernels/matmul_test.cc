// Specification of CpuBackend::Matmul: out[m][n] (+)= in[m][:] . weight[n][:], against a
// float64 reference, within kMaxRelError under MaxRowRelError; plus the batch invariance
// the engine relies on (a row's result does not depend on the other rows of the batch), and
// strided inputs and prologues giving the bits of their unfused forms.

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu_backend.h"
#include "tests/kernels/kernel_test_util.h"

namespace kvd {
namespace {

using kernel_test::kMaxRelError;
using kernel_test::MaxRowRelError;
using kernel_test::RandomFloats;
using ::testing::HasSubstr;

struct Shape {
  int m, n, k;
};

std::vector<double> ReferenceMatmul(const std::vector<float>& in, const std::vector<float>& w,
                                    Shape s) {
  std::vector<double> out(int64_t{s.m} * s.n);
  for (int i = 0; i < s.m; ++i) {
    for (int j = 0; j < s.n; ++j) {
      double acc = 0;
      for (int c = 0; c < s.k; ++c) acc += double{in[i * s.k + c]} * w[int64_t{j} * s.k + c];
      out[i * s.n + j] = acc;
    }
  }
  return out;
}

// Edges of every tile and block size, tails of the vector lanes, decode and prefill.
std::vector<Shape> Shapes() {
  return {{1, 1, 1},     {1, 64, 64},   {3, 5, 7},      {2, 4, 8},   {5, 33, 17},
          {33, 70, 130}, {64, 96, 256}, {1, 300, 1000}, {7, 1, 513}, {40, 37, 9}};
}

TEST(MatmulTest, MatchesFloat64Reference) {
  CpuBackend backend(3);
  for (Shape s : Shapes()) {
    SCOPED_TRACE(::testing::Message() << "m=" << s.m << " n=" << s.n << " k=" << s.k);
    const std::vector<float> in = RandomFloats(s.m * s.k, s.m * 131 + s.k);
    const std::vector<float> w = RandomFloats(s.n * s.k, s.n * 17 + s.k);
    std::vector<float> out(s.m * s.n, NAN);
    MatmulParams p{out.data(), in.data(), w.data(), DType::kF32, s.m, s.n, s.k, false};
    ASSERT_TRUE(backend.Matmul(p).ok());
    const std::vector<double> ref = ReferenceMatmul(in, w, s);
    EXPECT_LT(MaxRowRelError(out.data(), ref.data(), s.m, s.n), kMaxRelError);
  }
}

TEST(MatmulTest, AccumulateAddsToOut) {
  CpuBackend backend(2);
  for (Shape s : Shapes()) {
    SCOPED_TRACE(::testing::Message() << "m=" << s.m << " n=" << s.n << " k=" << s.k);
    const std::vector<float> in = RandomFloats(s.m * s.k, 7 + s.k);
    const std::vector<float> w = RandomFloats(s.n * s.k, 8 + s.n);
    const std::vector<float> residual = RandomFloats(s.m * s.n, 9, -10.0f, 10.0f);
    std::vector<float> out = residual;
    MatmulParams p{out.data(), in.data(), w.data(), DType::kF32, s.m, s.n, s.k, true};
    ASSERT_TRUE(backend.Matmul(p).ok());
    std::vector<double> ref = ReferenceMatmul(in, w, s);
    for (size_t i = 0; i < ref.size(); ++i) ref[i] += residual[i];
    EXPECT_LT(MaxRowRelError(out.data(), ref.data(), s.m, s.n), kMaxRelError);
  }
}

TEST(MatmulTest, RowResultDoesNotDependOnTheRestOfTheBatch) {
  CpuBackend backend(2);
  const int m = 37, n = 45, k = 203;
  const std::vector<float> in = RandomFloats(m * k, 30);
  const std::vector<float> w = RandomFloats(n * k, 31);
  std::vector<float> full(m * n);
  ASSERT_TRUE(backend.Matmul({full.data(), in.data(), w.data(), DType::kF32, m, n, k, false}).ok());
  // Every row alone, and sub-batches starting at odd offsets, give the same bits.
  for (int start = 0; start < m; ++start) {
    for (int len : {1, 3}) {
      if (start + len > m) continue;
      std::vector<float> part(len * n);
      ASSERT_TRUE(
          backend.Matmul({part.data(), &in[start * k], w.data(), DType::kF32, len, n, k, false})
              .ok());
      EXPECT_EQ(0, std::memcmp(part.data(), &full[start * n], part.size() * sizeof(float)))
          << "rows " << start << ".." << start + len;
    }
  }
}

// A strided input (in_stride) multiplies the same rows as a dense copy of them, bit for bit.
TEST(MatmulTest, StridedInputMultipliesTheSameRows) {
  CpuBackend backend(2);
  const int m = 5, n = 19, k = 37, stride = 50;
  const std::vector<float> wide = RandomFloats(m * stride, 40);
  std::vector<float> dense(m * k);
  for (int r = 0; r < m; ++r) std::memcpy(&dense[r * k], &wide[r * stride], k * sizeof(float));
  const std::vector<float> w = RandomFloats(n * k, 41);
  std::vector<float> want(m * n), got(m * n);
  ASSERT_TRUE(backend.Matmul({want.data(), dense.data(), w.data(), DType::kF32, m, n, k}).ok());
  MatmulParams p{got.data(), wide.data(), w.data(), DType::kF32, m, n, k};
  p.in_stride = stride;
  ASSERT_TRUE(backend.Matmul(p).ok());
  EXPECT_EQ(got, want);
}

// A prologue gives the bits of its op run first into a buffer that the product then reads:
// RmsNorm of in's rows with norm_weight, or SiluMul of gate = in and up (rows of a fused
// [gate | up] buffer, as the model lays them out), with and without accumulation.
TEST(MatmulTest, ProloguesEqualTheirOpsRunFirst) {
  CpuBackend backend(2);
  const int m = 6, n = 23, k = 40;
  const std::vector<float> w = RandomFloats(n * k, 50);
  const std::vector<float> residual = RandomFloats(m * n, 51, -3.0f, 3.0f);
  for (const bool accumulate : {false, true}) {
    SCOPED_TRACE(accumulate ? "accumulate" : "plain");
    // RmsNorm, over rows 2k apart.
    const std::vector<float> x = RandomFloats(m * 2 * k, 52, -4.0f, 4.0f);
    const std::vector<float> norm = RandomFloats(k, 53, 0.5f, 1.5f);
    std::vector<float> normed(m * k);
    for (int r = 0; r < m; ++r) {
      ASSERT_TRUE(
          backend.RmsNorm({&normed[r * k], &x[r * 2 * k], norm.data(), DType::kF32, 1, k, 1e-3f})
              .ok());
    }
    std::vector<float> want = residual, got = residual;
    ASSERT_TRUE(
        backend.Matmul({want.data(), normed.data(), w.data(), DType::kF32, m, n, k, accumulate})
            .ok());
    MatmulParams p{got.data(), x.data(), w.data(), DType::kF32, m, n, k, accumulate};
    p.prologue = MatmulPrologue::kRmsNorm;
    p.in_stride = 2 * k;
    p.norm_weight = norm.data();
    p.norm_eps = 1e-3f;
    ASSERT_TRUE(backend.Matmul(p).ok());
    EXPECT_EQ(got, want);

    // SiluMul of a fused [gate | up] row.
    const std::vector<float> gate_up = RandomFloats(m * 2 * k, 54, -6.0f, 6.0f);
    std::vector<float> h(m * k);
    ASSERT_TRUE(
        backend.SiluMul({h.data(), gate_up.data(), gate_up.data() + k, m, k, 2 * k, 2 * k}).ok());
    want = residual;
    got = residual;
    ASSERT_TRUE(
        backend.Matmul({want.data(), h.data(), w.data(), DType::kF32, m, n, k, accumulate}).ok());
    p = MatmulParams{got.data(), gate_up.data(), w.data(), DType::kF32, m, n, k, accumulate};
    p.prologue = MatmulPrologue::kSiluMul;
    p.in_stride = 2 * k;
    p.up = gate_up.data() + k;
    p.up_stride = 2 * k;
    ASSERT_TRUE(backend.Matmul(p).ok());
    EXPECT_EQ(got, want);
  }
}

TEST(MatmulTest, ZeroRowsIsANoOp) {
  CpuBackend backend(1);
  EXPECT_TRUE(backend.Matmul({nullptr, nullptr, nullptr, DType::kF32, 0, 4, 4, false}).ok());
}

TEST(MatmulTest, BadParamsAreRejected) {
  CpuBackend backend(2);
  std::vector<float> buf(64, 1.0f);
  const MatmulParams good{buf.data(), buf.data(), buf.data(), DType::kF32, 2, 4, 8, false};
  ASSERT_TRUE(backend.Matmul(good).ok());
  auto expect = [&](MatmulParams p, absl::StatusCode code, const char* field) {
    const absl::Status s = backend.Matmul(p);
    EXPECT_EQ(s.code(), code) << s;
    EXPECT_THAT(s.message(), HasSubstr("Matmul"));
    EXPECT_THAT(s.message(), HasSubstr(field));
  };
  MatmulParams p = good;
  p.weight = nullptr;
  expect(p, absl::StatusCode::kInvalidArgument, "weight");
  p = good;
  p.in = nullptr;
  expect(p, absl::StatusCode::kInvalidArgument, "in");
  p = good;
  p.k = 0;
  expect(p, absl::StatusCode::kInvalidArgument, "k=0");
  p = good;
  p.n = -1;
  expect(p, absl::StatusCode::kInvalidArgument, "n=-1");
  p = good;
  p.m = -2;
  expect(p, absl::StatusCode::kInvalidArgument, "m=-2");
  p = good;
  p.weight_dtype = DType::kBF16;
  expect(p, absl::StatusCode::kUnimplemented, "bf16");
  // The input and prologue (ValidateMatmulPrologue, which the CUDA backend checks too).
  p = good;
  p.in_stride = 7;
  expect(p, absl::StatusCode::kInvalidArgument, "in_stride 7 < k (8)");
  p = good;
  p.prologue = static_cast<MatmulPrologue>(9);
  expect(p, absl::StatusCode::kInvalidArgument, "unknown prologue 9");
  p = good;
  p.prologue = MatmulPrologue::kRmsNorm;
  expect(p, absl::StatusCode::kInvalidArgument, "without norm_weight");
  p.norm_weight = buf.data();
  p.norm_eps = -1.0f;
  expect(p, absl::StatusCode::kInvalidArgument, "norm_eps");
  p.norm_eps = 1e-5f;
  ASSERT_TRUE(backend.Matmul(p).ok());
  p.norm_dtype = DType::kBF16;
  expect(p, absl::StatusCode::kUnimplemented, "norm_dtype bf16");
  p = good;
  p.norm_weight = buf.data();  // left over, unread
  expect(p, absl::StatusCode::kInvalidArgument, "norm_weight given without kRmsNorm");
  p = good;
  p.prologue = MatmulPrologue::kSiluMul;
  expect(p, absl::StatusCode::kInvalidArgument, "without up");
  p.up = buf.data() + 32;
  ASSERT_TRUE(backend.Matmul(p).ok());
  p.up_stride = 4;
  expect(p, absl::StatusCode::kInvalidArgument, "up_stride 4 < k (8)");
  p = good;
  p.up = buf.data();
  expect(p, absl::StatusCode::kInvalidArgument, "up given without kSiluMul");
}

}  // namespace
}  // namespace kvd
