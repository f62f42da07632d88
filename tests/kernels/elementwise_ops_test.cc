// Specification of the CPU backend's row-wise ops (Embedding, RmsNorm, Rope, SiluMul):
// each against a naive float64 reference written here, on seeded random inputs of several
// shapes, within kMaxRelError under MaxRowRelError (kernel_test_util.h).

#include <cmath>
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

TEST(EmbeddingTest, GathersTableRowsExactly) {
  CpuBackend backend(2);
  const int vocab = 50, dim = 19;
  const std::vector<float> table = RandomFloats(vocab * dim, 1);
  const std::vector<int32_t> ids = {0, 49, 7, 7, 23, 1};
  std::vector<float> out(ids.size() * dim, -1.0f);
  EmbeddingParams p{
      out.data(), table.data(), DType::kF32, ids.data(), static_cast<int32_t>(ids.size()),
      dim,        vocab};
  ASSERT_TRUE(backend.Embedding(p).ok());
  for (size_t t = 0; t < ids.size(); ++t) {
    EXPECT_EQ(0, std::memcmp(&out[t * dim], &table[ids[t] * dim], dim * sizeof(float)))
        << "token " << t;
  }
}

TEST(EmbeddingTest, OutOfRangeIdIsInvalidArgumentAndWritesNothing) {
  CpuBackend backend(1);
  const std::vector<float> table = RandomFloats(10 * 4, 2);
  for (int32_t bad : {-1, 10, 1 << 30}) {
    const std::vector<int32_t> ids = {3, bad};
    std::vector<float> out(8, 42.0f);
    const absl::Status s =
        backend.Embedding({out.data(), table.data(), DType::kF32, ids.data(), 2, 4, 10});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr("token_ids[1]"));
    EXPECT_EQ(out, std::vector<float>(8, 42.0f));
  }
}

TEST(RmsNormTest, MatchesFloat64Reference) {
  CpuBackend backend(3);
  for (auto [rows, dim] :
       std::vector<std::pair<int, int>>{{1, 1}, {1, 64}, {5, 7}, {9, 288}, {3, 4096}}) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << dim);
    const std::vector<float> in = RandomFloats(rows * dim, 3 + dim, -2.0f, 2.0f);
    const std::vector<float> w = RandomFloats(dim, 4 + dim, 0.5f, 1.5f);
    std::vector<float> out(rows * dim);
    RmsNormParams p{out.data(), in.data(), w.data(), DType::kF32, rows, dim, 1e-5f};
    ASSERT_TRUE(backend.RmsNorm(p).ok());
    std::vector<double> ref(rows * dim);
    for (int r = 0; r < rows; ++r) {
      double ss = 0;
      for (int i = 0; i < dim; ++i) ss += double{in[r * dim + i]} * in[r * dim + i];
      const double scale = 1.0 / std::sqrt(ss / dim + 1e-5);
      for (int i = 0; i < dim; ++i) ref[r * dim + i] = w[i] * in[r * dim + i] * scale;
    }
    EXPECT_LT(MaxRowRelError(out.data(), ref.data(), rows, dim), kMaxRelError);

    // In place (out == in) gives the same bits.
    std::vector<float> inplace = in;
    p.out = inplace.data();
    p.in = inplace.data();
    ASSERT_TRUE(backend.RmsNorm(p).ok());
    EXPECT_EQ(inplace, out);
  }
}

// eps is added to the mean square before the root: it keeps an all-zero row finite (zeros,
// not 0 * inf = NaN), and on a row whose mean square is comparable to it, it sets the scale.
TEST(RmsNormTest, EpsJoinsTheMeanSquare) {
  CpuBackend backend(1);
  const std::vector<float> w = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<float> in = {0.0f, 0.0f,  0.0f, 0.0f,    // all zero
                                 0.5f, -0.5f, 0.5f, -0.5f};  // mean square 0.25
  std::vector<float> out(8, -1.0f);
  ASSERT_TRUE(
      backend.RmsNorm(RmsNormParams{out.data(), in.data(), w.data(), DType::kF32, 2, 4, 0.75f})
          .ok());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(out[i], 0.0f) << i;
  // 1 / sqrt(0.25 + 0.75) = 1: the input times the weight.
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(out[4 + i], w[i] * in[4 + i]) << i;
}

// Reference rotation: the angle is part of the contract in float arithmetic
// (freq = 1.0f / powf(theta, 2i/(float)head_dim), val = pos * freq, as llama2.c), because
// a float angle for a large position differs from the exact one by more than the
// tolerance; the rotation itself is done here in float64.
void ReferenceRope(std::vector<double>& x, int64_t stride, int num_tokens, int num_heads,
                   int head_dim, const std::vector<int32_t>& pos, float theta, RopeStyle style) {
  const int half = head_dim / 2;
  for (int t = 0; t < num_tokens; ++t) {
    for (int h = 0; h < num_heads; ++h) {
      double* v = &x[t * stride + h * head_dim];
      for (int i = 0; i < half; ++i) {
        const float freq = 1.0f / powf(theta, static_cast<float>(2 * i) / (float)head_dim);
        const double angle = static_cast<float>(pos[t]) * freq;
        const int a = style == RopeStyle::kInterleaved ? 2 * i : i;
        const int b = style == RopeStyle::kInterleaved ? 2 * i + 1 : i + half;
        const double v0 = v[a], v1 = v[b];
        v[a] = v0 * std::cos(angle) - v1 * std::sin(angle);
        v[b] = v0 * std::sin(angle) + v1 * std::cos(angle);
      }
    }
  }
}

TEST(RopeTest, BothStylesMatchFloat64RotationOfTheSpecifiedAngle) {
  CpuBackend backend(2);
  struct Shape {
    int tokens, q_heads, kv_heads, head_dim, pad;
  };
  for (RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalf}) {
    for (Shape s : {Shape{1, 1, 1, 2, 0}, Shape{3, 4, 2, 8, 0}, Shape{5, 6, 2, 48, 3},
                    Shape{4, 8, 8, 128, 16}}) {
      SCOPED_TRACE(::testing::Message() << "style=" << static_cast<int>(style)
                                        << " tokens=" << s.tokens << " hd=" << s.head_dim);
      const int q_stride = s.q_heads * s.head_dim + s.pad;
      const int k_stride = s.kv_heads * s.head_dim + 2 * s.pad;
      std::vector<float> q = RandomFloats(s.tokens * q_stride, 10 + s.head_dim);
      std::vector<float> k = RandomFloats(s.tokens * k_stride, 11 + s.head_dim);
      std::vector<int32_t> pos(s.tokens);
      for (int t = 0; t < s.tokens; ++t) pos[t] = t * 977 % 5000;
      std::vector<double> q_ref(q.begin(), q.end()), k_ref(k.begin(), k.end());
      RopeParams p{q.data(),   k.data(), pos.data(), s.tokens,  s.q_heads, s.kv_heads,
                   s.head_dim, q_stride, k_stride,   500000.0f, style};
      ASSERT_TRUE(backend.Rope(p).ok());
      ReferenceRope(q_ref, q_stride, s.tokens, s.q_heads, s.head_dim, pos, p.theta, style);
      ReferenceRope(k_ref, k_stride, s.tokens, s.kv_heads, s.head_dim, pos, p.theta, style);
      // Full rows, padding included: padding must be untouched (compared with itself).
      EXPECT_LT(MaxRowRelError(q.data(), q_ref.data(), s.tokens, q_stride), kMaxRelError);
      EXPECT_LT(MaxRowRelError(k.data(), k_ref.data(), s.tokens, k_stride), kMaxRelError);
    }
  }
}

TEST(RopeTest, Bf16CopyOfQIsTheRotatedRowsRoundedAndNothingElse) {
  CpuBackend backend(2);
  const int tokens = 5, q_heads = 4, kv_heads = 2, head_dim = 16;
  const int q_stride = (q_heads + 2 * kv_heads) * head_dim;
  const int copy_stride = q_heads * head_dim + 5;  // padding after each row: left alone
  std::vector<float> qkv = RandomFloats(tokens * q_stride, 21);
  std::vector<uint16_t> copy(tokens * copy_stride, 0xabcd);
  std::vector<int32_t> pos = {0, 7, 300, 4000, 12};
  RopeParams p{qkv.data(), qkv.data() + q_heads * head_dim,
               pos.data(), tokens,
               q_heads,    kv_heads,
               head_dim,   q_stride,
               q_stride,   10000.0f};
  p.q_bf16 = copy.data();
  p.q_bf16_stride = copy_stride;
  ASSERT_TRUE(backend.Rope(p).ok());
  for (int t = 0; t < tokens; ++t) {
    for (int i = 0; i < copy_stride; ++i) {
      const uint16_t want = i < q_heads * head_dim ? Bf16Bits(qkv[t * q_stride + i]) : 0xabcd;
      ASSERT_EQ(copy[t * copy_stride + i], want) << "token " << t << " element " << i;
    }
  }
  // Round to nearest, ties to even; NaN stays NaN.
  EXPECT_EQ(Bf16Bits(1.0f), 0x3f80);
  EXPECT_EQ(Bf16Bits(1.0f + 0x1p-8f), 0x3f80);             // tie: down to even
  EXPECT_EQ(Bf16Bits(1.0f + 0x1p-7f + 0x1p-8f), 0x3f82);   // tie: up to even
  EXPECT_EQ(Bf16Bits(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // above the tie
  EXPECT_EQ(Bf16Bits(-2.5f), 0xc020);
  EXPECT_EQ(Bf16Bits(std::nanf("")) & 0x7fc0, 0x7fc0);
}

TEST(RopeTest, PositionZeroIsIdentityAndStylesDiffer) {
  CpuBackend backend(1);
  const std::vector<float> orig = RandomFloats(8, 5);
  std::vector<float> q = orig, k = orig;
  const int32_t zero = 0;
  RopeParams p{q.data(), k.data(), &zero, 1, 1, 1, 8, 8, 8, 10000.0f, RopeStyle::kInterleaved};
  ASSERT_TRUE(backend.Rope(p).ok());
  EXPECT_EQ(q, orig);
  const int32_t seven = 7;
  std::vector<float> a = orig, b = orig;
  p.positions = &seven;
  p.q = p.k = a.data();
  p.num_kv_heads = 0;
  ASSERT_TRUE(backend.Rope(p).ok());
  p.q = b.data();
  p.style = RopeStyle::kHalf;
  ASSERT_TRUE(backend.Rope(p).ok());
  EXPECT_NE(a, b);
}

TEST(SiluMulTest, MatchesFloat64ReferenceWithStrides) {
  CpuBackend backend(2);
  for (auto [rows, dim] : std::vector<std::pair<int, int>>{{1, 1}, {2, 33}, {7, 768}}) {
    // gate and up interleaved in one [rows][2*dim] buffer, as a fused w1|w3 matmul gives.
    const std::vector<float> gu = RandomFloats(rows * 2 * dim, 20 + dim, -8.0f, 8.0f);
    std::vector<float> out(rows * dim);
    SiluMulParams p{out.data(), gu.data(), gu.data() + dim, rows, dim, 2 * dim, 2 * dim};
    ASSERT_TRUE(backend.SiluMul(p).ok());
    std::vector<double> ref(rows * dim);
    for (int r = 0; r < rows; ++r) {
      for (int i = 0; i < dim; ++i) {
        const double g = gu[r * 2 * dim + i], u = gu[r * 2 * dim + dim + i];
        ref[r * dim + i] = g / (1.0 + std::exp(-g)) * u;
      }
    }
    EXPECT_LT(MaxRowRelError(out.data(), ref.data(), rows, dim), kMaxRelError);
  }
}

TEST(ElementwiseOpsTest, ZeroRowsIsANoOp) {
  CpuBackend backend(1);
  EXPECT_TRUE(backend.Embedding({}).ok());
  EXPECT_TRUE(backend.RmsNorm({}).ok());
  EXPECT_TRUE(backend.Rope({}).ok());
  EXPECT_TRUE(backend.SiluMul({}).ok());
}

TEST(ElementwiseOpsTest, BadParamsAreInvalidArgumentNamingOpAndField) {
  CpuBackend backend(2);
  std::vector<float> buf(64, 1.0f);
  const std::vector<int32_t> ids = {0, 1};
  const EmbeddingParams emb{buf.data(), buf.data(), DType::kF32, ids.data(), 2, 4, 8};
  const RmsNormParams norm{buf.data(), buf.data(), buf.data(), DType::kF32, 2, 4, 1e-5f};
  const RopeParams rope{buf.data(), buf.data(), ids.data(), 2, 2, 1, 4, 8, 4};
  const SiluMulParams silu{buf.data(), buf.data(), buf.data(), 2, 4, 4, 4};
  ASSERT_TRUE(backend.Embedding(emb).ok());
  ASSERT_TRUE(backend.RmsNorm(norm).ok());
  ASSERT_TRUE(backend.Rope(rope).ok());
  ASSERT_TRUE(backend.SiluMul(silu).ok());

  auto expect_invalid = [](absl::Status s, const char* op, const char* field) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(s.message(), HasSubstr(op));
    EXPECT_THAT(s.message(), HasSubstr(field));
  };
  {
    EmbeddingParams p = emb;
    p.out = nullptr;
    expect_invalid(backend.Embedding(p), "Embedding", "out");
    p = emb;
    p.dim = 0;
    expect_invalid(backend.Embedding(p), "Embedding", "dim");
    p = emb;
    p.num_tokens = -1;
    expect_invalid(backend.Embedding(p), "Embedding", "num_tokens");
  }
  {
    RmsNormParams p = norm;
    p.weight = nullptr;
    expect_invalid(backend.RmsNorm(p), "RmsNorm", "weight");
    p = norm;
    p.dim = -3;
    expect_invalid(backend.RmsNorm(p), "RmsNorm", "dim");
  }
  {
    RopeParams p = rope;
    p.head_dim = 3;
    p.q_stride = 6;
    expect_invalid(backend.Rope(p), "Rope", "head_dim");
    p = rope;
    p.theta = 0.0f;
    expect_invalid(backend.Rope(p), "Rope", "theta");
    p = rope;
    p.positions = nullptr;
    expect_invalid(backend.Rope(p), "Rope", "positions");
    p = rope;
    p.q_stride = 7;
    expect_invalid(backend.Rope(p), "Rope", "q_stride");
    p = rope;
    p.k = nullptr;
    expect_invalid(backend.Rope(p), "Rope", "k");
    p = rope;
    p.q_bf16 = buf.data();
    p.q_bf16_stride = 7;
    expect_invalid(backend.Rope(p), "Rope", "q_bf16_stride");
    // The rest of ValidateRope (kernels/backend.h), which the CUDA backend checks too.
    p = rope;
    p.style = static_cast<RopeStyle>(7);
    expect_invalid(backend.Rope(p), "Rope", "style 7");
    p = rope;
    p.num_q_heads = p.num_kv_heads = 0;
    expect_invalid(backend.Rope(p), "Rope", "not both 0");
    p = rope;
    p.num_tokens = -1;
    expect_invalid(backend.Rope(p), "Rope", "num_tokens");
  }
  {
    SiluMulParams p = silu;
    p.up = nullptr;
    expect_invalid(backend.SiluMul(p), "SiluMul", "up");
    p = silu;
    p.gate_stride = 3;
    expect_invalid(backend.SiluMul(p), "SiluMul", "gate_stride");
    // out over a fused [rows][gate | up] buffer: writing row 1 would overwrite the input of a
    // row the pool may not have read yet. Only an input with stride dim may be out itself.
    p = silu;
    p.gate_stride = p.up_stride = 8;
    p.up = buf.data() + 4;
    expect_invalid(backend.SiluMul(p), "SiluMul", "out overlaps gate");
    p.out = buf.data() + 16;  // apart from both inputs
    EXPECT_TRUE(backend.SiluMul(p).ok());
    p.gate = buf.data() + 32;
    p.out = buf.data() + 4;  // up's first row, but up's rows are 8 apart
    expect_invalid(backend.SiluMul(p), "SiluMul", "out overlaps up");
  }
}

TEST(ElementwiseOpsTest, NonF32WeightsAreUnimplementedNamingOpAndDtype) {
  CpuBackend backend(1);
  std::vector<float> buf(16, 1.0f);
  const int32_t id = 0;
  for (DType t : {DType::kBF16, DType::kF16, DType::kInt8}) {
    const absl::Status emb = backend.Embedding({buf.data(), buf.data(), t, &id, 1, 4, 4});
    EXPECT_EQ(emb.code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(emb.message(), HasSubstr("Embedding"));
    EXPECT_THAT(emb.message(), HasSubstr(std::string(DTypeName(t))));
    const absl::Status norm = backend.RmsNorm({buf.data(), buf.data(), buf.data(), t, 1, 4});
    EXPECT_EQ(norm.code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(norm.message(), HasSubstr("RmsNorm"));
  }
}

}  // namespace
}  // namespace kvd
