// CUDA Matmul (bf16 weights and input in cuBLASLt, fp32 accumulate) against the CPU
// reference on bf16-rounded inputs.

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "kernels/params.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvd::gpu_test {
namespace {

struct MatmulShape {
  int m;
  int n;
  int k;
};

class MatmulTest : public GpuVsCpuTest {
 protected:
  void Check(const MatmulShape& s, bool accumulate) {
    SCOPED_TRACE(testing::Message() << "m " << s.m << " n " << s.n << " k " << s.k
                                    << (accumulate ? " accumulate" : ""));
    // The GPU rounds its input to bf16; round both inputs here so the backends multiply
    // the same numbers.
    const std::vector<float> in = RoundBf16(RandomFloats(size_t(s.m) * s.k, s.m + s.k));
    const std::vector<float> weight = RoundBf16(RandomFloats(size_t(s.n) * s.k, s.n * 3 + 1));
    const size_t out_count = size_t(s.m) * s.n;
    const std::vector<float> residual = RandomFloats(out_count, 99, -4, 4);

    DeviceBuffer cpu_in = Upload(cpu(), in);
    DeviceBuffer cpu_w = Upload(cpu(), weight);
    DeviceBuffer cpu_out = accumulate ? Upload(cpu(), residual) : Poisoned(cpu(), out_count * 4);
    DeviceBuffer gpu_in = Upload(gpu(), in);
    DeviceBuffer gpu_w = OrDie(gpu().UploadWeights(weight.data(), weight.size()), "upload");
    DeviceBuffer gpu_out = accumulate ? Upload(gpu(), residual) : Poisoned(gpu(), out_count * 4);

    MatmulParams p;
    p.m = s.m;
    p.n = s.n;
    p.k = s.k;
    p.accumulate = accumulate;
    p.out = cpu_out.as<float>();
    p.in = cpu_in.as<float>();
    p.weight = cpu_w.data();
    p.weight_dtype = DType::kF32;
    ASSERT_TRUE(cpu().Matmul(p).ok());
    p.out = gpu_out.as<float>();
    p.in = gpu_in.as<float>();
    p.weight = gpu_w.data();
    p.weight_dtype = gpu().weight_dtype();
    const absl::Status status = gpu().Matmul(p);
    ASSERT_TRUE(status.ok()) << status;
    // Products of bf16 values are exact in fp32; only the summation order (and the tensor
    // cores' fp32 accumulation) differs. A dot of k terms in [-1, 1] has spread ~sqrt(k/9);
    // allow 3e-4 of sqrt(k) absolute. A transposed or misaligned operand errs by O(sqrt(k)).
    const double atol = 3e-4 * std::sqrt(double(s.k));
    EXPECT_TRUE(AllClose(DownloadFloats(gpu(), gpu_out.data(), out_count),
                         DownloadFloats(cpu(), cpu_out.data(), out_count), 1e-4, atol));
  }
};

TEST_F(MatmulTest, DecodeAndPrefillShapes) {
  for (const MatmulShape& s :
       {MatmulShape{1, 64, 64}, MatmulShape{1, 4096, 4096}, MatmulShape{7, 288, 288},
        MatmulShape{33, 768, 512}, MatmulShape{256, 1024, 2048}, MatmulShape{64, 32000, 256}}) {
    Check(s, /*accumulate=*/false);
  }
}

TEST_F(MatmulTest, AccumulateAddsToOutput) {
  for (const MatmulShape& s : {MatmulShape{1, 512, 256}, MatmulShape{17, 288, 768}}) {
    Check(s, /*accumulate=*/true);
  }
}

TEST_F(MatmulTest, OddShapesTakeAFallbackAndStayCorrect) {
  // k not a multiple of 8 leaves bf16 rows 2-byte aligned: no cuBLASLt algorithm may
  // apply, and the backend must fall back rather than fail.
  for (const MatmulShape& s :
       {MatmulShape{5, 33, 17}, MatmulShape{3, 7, 301}, MatmulShape{1, 1, 1}}) {
    Check(s, /*accumulate=*/false);
    Check(s, /*accumulate=*/true);
  }
}

// Past the skinny kernel's rows the backend reads a bf16 copy of the input when given one
// (MatmulParams::in_bf16, which RmsNorm and SiluMul write) instead of rounding `in` itself;
// up to them it reads `in`. The copy given here holds twice `in` (exact in bf16), so the
// product shows which one was read.
TEST_F(MatmulTest, ReadsABf16CopyOfItsInputWhereItSaysItDoes) {
  const int n = 512, k = 1024;
  for (const int m : {1, 8, 9, 64}) {
    SCOPED_TRACE(testing::Message() << "m " << m);
    const bool reads_copy = m > 8;
    EXPECT_EQ(gpu().ReadsBf16MatmulInput(m), reads_copy);
    const std::vector<float> in = RoundBf16(RandomFloats(size_t(m) * k, m + 5));
    std::vector<uint16_t> twice(in.size());
    for (size_t i = 0; i < in.size(); ++i) twice[i] = Bf16Bits(2.0f * in[i]);
    const std::vector<float> weight = RoundBf16(RandomFloats(size_t(n) * k, 77));
    const size_t out_count = size_t(m) * n;

    DeviceBuffer cpu_in = Upload(cpu(), in);
    DeviceBuffer cpu_w = Upload(cpu(), weight);
    DeviceBuffer cpu_out = Poisoned(cpu(), out_count * 4);
    MatmulParams p{cpu_out.as<float>(), cpu_in.as<float>(), cpu_w.data(), DType::kF32, m, n, k};
    ASSERT_TRUE(cpu().Matmul(p).ok());
    std::vector<float> expected = DownloadFloats(cpu(), cpu_out.data(), out_count);
    if (reads_copy) {
      for (float& x : expected) x *= 2.0f;
    }

    DeviceBuffer gpu_in = Upload(gpu(), in);
    DeviceBuffer gpu_copy = Upload(gpu(), twice);
    DeviceBuffer gpu_w = OrDie(gpu().UploadWeights(weight.data(), weight.size()), "upload");
    DeviceBuffer gpu_out = Poisoned(gpu(), out_count * 4);
    p = {gpu_out.as<float>(), gpu_in.as<float>(), gpu_w.data(), DType::kBF16, m, n, k};
    p.in_bf16 = gpu_copy.data();
    const absl::Status status = gpu().Matmul(p);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_TRUE(AllClose(DownloadFloats(gpu(), gpu_out.data(), out_count), expected, 1e-4,
                         6e-4 * std::sqrt(double(k))));
  }
}

TEST_F(MatmulTest, EmptyBatchIsANoOp) {
  MatmulParams p;
  p.m = 0;
  p.n = 64;
  p.k = 64;
  p.weight_dtype = DType::kBF16;
  EXPECT_TRUE(gpu().Matmul(p).ok());
}

}  // namespace
}  // namespace kvd::gpu_test
