// CUDA embedding, RMSNorm, RoPE, SiLU*mul and weight upload against the CPU reference.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/params.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvd::gpu_test {
namespace {

using ElementwiseOpsTest = GpuVsCpuTest;

TEST_F(ElementwiseOpsTest, UploadWeightsRoundsToNearestEvenBf16) {
  std::vector<float> host = RandomFloats(100003, 1, -3.0f, 3.0f);
  // Ties, values that round up into the next binade, tiny and huge magnitudes, infinities.
  const std::vector<float> special = {1.0f + 1.0f / 256,  // tie, rounds to even (down)
                                      1.0f + 3.0f / 256,  // tie, rounds to even (up)
                                      1.9999999f,
                                      1e-40f,
                                      -3.3e38f,
                                      std::numeric_limits<float>::infinity(),
                                      -std::numeric_limits<float>::infinity(),
                                      0.0f,
                                      -0.0f};
  host.insert(host.end(), special.begin(), special.end());
  DeviceBuffer weights = OrDie(gpu().UploadWeights(host.data(), host.size()), "UploadWeights");
  ASSERT_EQ(weights.bytes(), host.size() * 2);
  const std::vector<uint8_t> bytes = DownloadBytes(gpu(), weights.data(), weights.bytes());
  for (size_t i = 0; i < host.size(); ++i) {
    uint16_t got;
    std::memcpy(&got, bytes.data() + 2 * i, 2);
    ASSERT_EQ(got, Bf16Bits(host[i])) << "element " << i << " = " << host[i];
  }
}

TEST_F(ElementwiseOpsTest, EmbeddingGathersBf16AndF32Rows) {
  for (const int dim : {64, 288, 4096}) {
    SCOPED_TRACE(testing::Message() << "dim " << dim);
    const int vocab = 517;
    const std::vector<float> table = RoundBf16(RandomFloats(size_t{vocab} * dim, dim));
    std::vector<int32_t> ids = {0, vocab - 1, 5, 5, 300, 17, 1};
    DeviceBuffer cpu_table = Upload(cpu(), table);
    DeviceBuffer gpu_bf16 = OrDie(gpu().UploadWeights(table.data(), table.size()), "upload");
    DeviceBuffer gpu_f32 = Upload(gpu(), table);
    DeviceBuffer cpu_ids = Upload(cpu(), ids);
    DeviceBuffer gpu_ids = Upload(gpu(), ids);
    const size_t out_count = ids.size() * dim;
    DeviceBuffer cpu_out = Poisoned(cpu(), out_count * 4);

    EmbeddingParams p;
    p.num_tokens = static_cast<int32_t>(ids.size());
    p.dim = dim;
    p.vocab_size = vocab;
    p.out = cpu_out.as<float>();
    p.table = cpu_table.data();
    p.table_dtype = DType::kF32;
    p.token_ids = cpu_ids.as<int32_t>();
    ASSERT_TRUE(cpu().Embedding(p).ok());
    const std::vector<float> expected = DownloadFloats(cpu(), cpu_out.data(), out_count);

    for (const DType dtype : {DType::kBF16, DType::kF32}) {
      DeviceBuffer gpu_out = Poisoned(gpu(), out_count * 4);
      p.out = gpu_out.as<float>();
      p.table = dtype == DType::kBF16 ? gpu_bf16.data() : gpu_f32.data();
      p.table_dtype = dtype;
      p.token_ids = gpu_ids.as<int32_t>();
      const absl::Status s = gpu().Embedding(p);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_TRUE(AllClose(DownloadFloats(gpu(), gpu_out.data(), out_count), expected, 0, 0))
          << DTypeName(dtype);
    }
  }
}

TEST_F(ElementwiseOpsTest, RmsNormMatchesReference) {
  for (const auto& [rows, dim] : {std::pair{1, 64}, {7, 288}, {33, 4096}, {3, 5000}}) {
    SCOPED_TRACE(testing::Message() << rows << " x " << dim);
    const std::vector<float> in = RandomFloats(size_t(rows) * dim, rows * 31 + dim, -2, 2);
    const std::vector<float> weight = RoundBf16(RandomFloats(dim, dim + 7, 0.5f, 1.5f));
    DeviceBuffer cpu_in = Upload(cpu(), in);
    DeviceBuffer cpu_w = Upload(cpu(), weight);
    DeviceBuffer cpu_out = Poisoned(cpu(), in.size() * 4);
    DeviceBuffer gpu_in = Upload(gpu(), in);
    DeviceBuffer gpu_w = OrDie(gpu().UploadWeights(weight.data(), weight.size()), "upload");
    DeviceBuffer gpu_out = Poisoned(gpu(), in.size() * 4);

    RmsNormParams p;
    p.num_rows = rows;
    p.dim = dim;
    p.eps = 1e-5f;
    p.out = cpu_out.as<float>();
    p.in = cpu_in.as<float>();
    p.weight = cpu_w.data();
    p.weight_dtype = DType::kF32;
    ASSERT_TRUE(cpu().RmsNorm(p).ok());
    p.out = gpu_out.as<float>();
    p.in = gpu_in.as<float>();
    p.weight = gpu_w.data();
    p.weight_dtype = DType::kBF16;
    const absl::Status s = gpu().RmsNorm(p);
    ASSERT_TRUE(s.ok()) << s;
    // Only the order of the fp32 sum of squares differs.
    EXPECT_TRUE(AllClose(DownloadFloats(gpu(), gpu_out.data(), in.size()),
                         DownloadFloats(cpu(), cpu_out.data(), in.size()), 1e-5, 1e-6));
  }
}

TEST_F(ElementwiseOpsTest, RopeMatchesReferenceInBothStyles) {
  for (const RopeStyle style : {RopeStyle::kInterleaved, RopeStyle::kHalf}) {
    for (const int head_dim : {64, 128}) {
      SCOPED_TRACE(testing::Message()
                   << "style " << static_cast<int>(style) << " head_dim " << head_dim);
      const int tokens = 37;
      const int q_heads = 8;
      const int kv_heads = 2;
      // q and k are slices of one fused qkv row, as the forward pass lays them out.
      const int stride = (q_heads + 2 * kv_heads) * head_dim;
      const std::vector<float> qkv = RandomFloats(size_t(tokens) * stride, head_dim + 3);
      std::vector<int32_t> positions(tokens);
      std::mt19937 rng(11);
      for (int t = 0; t < tokens; ++t) positions[t] = t < 3 ? t : int32_t(rng() % 4096);
      DeviceBuffer cpu_qkv = Upload(cpu(), qkv);
      DeviceBuffer gpu_qkv = Upload(gpu(), qkv);
      DeviceBuffer cpu_pos = Upload(cpu(), positions);
      DeviceBuffer gpu_pos = Upload(gpu(), positions);

      RopeParams p;
      p.num_tokens = tokens;
      p.num_q_heads = q_heads;
      p.num_kv_heads = kv_heads;
      p.head_dim = head_dim;
      p.q_stride = stride;
      p.k_stride = stride;
      p.theta = 500000.0f;
      p.style = style;
      p.q = cpu_qkv.as<float>();
      p.k = cpu_qkv.as<float>() + q_heads * head_dim;
      p.positions = cpu_pos.as<int32_t>();
      ASSERT_TRUE(cpu().Rope(p).ok());
      p.q = gpu_qkv.as<float>();
      p.k = gpu_qkv.as<float>() + q_heads * head_dim;
      p.positions = gpu_pos.as<int32_t>();
      // On the GPU also the bf16 copy of q (rows with padding after them).
      const int copy_stride = q_heads * head_dim + 8;
      DeviceBuffer gpu_copy = Poisoned(gpu(), size_t(tokens) * copy_stride * 2);
      p.q_bf16 = gpu_copy.data();
      p.q_bf16_stride = copy_stride;
      const absl::Status s = gpu().Rope(p);
      ASSERT_TRUE(s.ok()) << s;
      // The copy is the GPU's own rotated q rounded to nearest, bit for bit; padding untouched.
      const std::vector<float> gpu_q = DownloadFloats(gpu(), gpu_qkv.data(), qkv.size());
      const std::vector<uint8_t> copy =
          DownloadBytes(gpu(), gpu_copy.data(), size_t(tokens) * copy_stride * 2);
      int mismatches = 0;
      for (int t = 0; t < tokens; ++t) {
        for (int i = 0; i < copy_stride; ++i) {
          uint16_t got;
          std::memcpy(&got, &copy[2 * (size_t(t) * copy_stride + i)], 2);
          const uint16_t want =
              i < q_heads * head_dim ? Bf16Bits(gpu_q[size_t(t) * stride + i]) : 0xffff;
          mismatches += got != want;
        }
      }
      EXPECT_EQ(mismatches, 0);
      // Same fp32 angle formula; a frequency one ulp apart (libm's powf is not always
      // correctly rounded) moves the angle by up to pos * 6e-8 = 2.5e-4 at position 4096,
      // and sin/cos differ by a few ulps. A wrong pairing or style errs by O(1). The V
      // slices of the fused rows must come back untouched (checked by the same call).
      EXPECT_TRUE(AllClose(DownloadFloats(gpu(), gpu_qkv.data(), qkv.size()),
                           DownloadFloats(cpu(), cpu_qkv.data(), qkv.size()), 0, 5e-4));
    }
  }
}

TEST_F(ElementwiseOpsTest, RopeRejectsABf16CopyWithShortRows) {
  DeviceBuffer buf = Poisoned(gpu(), 4096);
  RopeParams p;
  p.num_tokens = 1;
  p.num_q_heads = 2;
  p.num_kv_heads = 1;
  p.head_dim = 8;
  p.q_stride = p.k_stride = 32;
  p.q = buf.as<float>();
  p.k = buf.as<float>() + 16;
  p.positions = buf.as<int32_t>() + 512;
  p.q_bf16 = buf.as<float>() + 256;
  p.q_bf16_stride = 15;  // < 2 heads * 8
  const absl::Status s = gpu().Rope(p);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("q_bf16_stride"), std::string::npos) << s;
  EXPECT_TRUE(gpu().Synchronize().ok());
}

TEST_F(ElementwiseOpsTest, SiluMulMatchesReferenceWithStrides) {
  const int rows = 19;
  const int dim = 1000;
  const int stride = 2 * dim;  // gate and up halves of one fused row
  const std::vector<float> gate_up = RandomFloats(size_t(rows) * stride, 5, -6, 6);
  DeviceBuffer cpu_in = Upload(cpu(), gate_up);
  DeviceBuffer gpu_in = Upload(gpu(), gate_up);
  DeviceBuffer cpu_out = Poisoned(cpu(), size_t(rows) * dim * 4);
  DeviceBuffer gpu_out = Poisoned(gpu(), size_t(rows) * dim * 4);
  SiluMulParams p;
  p.num_rows = rows;
  p.dim = dim;
  p.gate_stride = stride;
  p.up_stride = stride;
  p.out = cpu_out.as<float>();
  p.gate = cpu_in.as<float>();
  p.up = cpu_in.as<float>() + dim;
  ASSERT_TRUE(cpu().SiluMul(p).ok());
  p.out = gpu_out.as<float>();
  p.gate = gpu_in.as<float>();
  p.up = gpu_in.as<float>() + dim;
  const absl::Status s = gpu().SiluMul(p);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(AllClose(DownloadFloats(gpu(), gpu_out.data(), size_t(rows) * dim),
                       DownloadFloats(cpu(), cpu_out.data(), size_t(rows) * dim), 1e-6, 1e-7));
}

TEST_F(ElementwiseOpsTest, UnsupportedDtypesAreRejectedNotLaunched) {
  RmsNormParams p;
  p.num_rows = 1;
  p.dim = 8;
  p.weight_dtype = DType::kInt8;
  EXPECT_EQ(gpu().RmsNorm(p).code(), absl::StatusCode::kUnimplemented);
  MatmulParams m;
  m.m = 1;
  m.n = 8;
  m.k = 8;
  m.weight_dtype = DType::kF32;
  EXPECT_EQ(gpu().Matmul(m).code(), absl::StatusCode::kUnimplemented);
  EXPECT_TRUE(gpu().Synchronize().ok());
}

}  // namespace
}  // namespace kvd::gpu_test
