// CUDA Matmul (bf16 weights and input in cuBLASLt or the skinny kernel, fp32 accumulate)
// against the CPU reference on bf16-rounded inputs, with and without prologues.

#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
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

// A Matmul with a prologue against the CPU backend's (which runs RmsNorm or SiluMul into a
// buffer, then the product, all in fp32). The prologue's kernel writes bf16 rows, which the
// skinny kernel reads up to 8 rows and cuBLAS past them (or where the skinny kernel cannot
// run).
struct PrologueCase {
  int m, n, k;
  MatmulPrologue prologue;
  int in_stride;  // 0: k (kSiluMul: up follows each gate row, rows in_stride apart)
  bool accumulate;
};

class MatmulPrologueTest : public GpuVsCpuTest {
 protected:
  void Check(const PrologueCase& c) {
    const bool silu = c.prologue == MatmulPrologue::kSiluMul;
    const int stride = c.in_stride == 0 ? c.k : c.in_stride;
    SCOPED_TRACE(testing::Message()
                 << "m " << c.m << " n " << c.n << " k " << c.k << (silu ? " silu" : " rmsnorm")
                 << " stride " << stride << (c.accumulate ? " accumulate" : ""));
    // Rows of [in | up] for SiLU, of in (rms about 2.3) for the norm; the norm weight and
    // the matrix in bf16 for both backends.
    const std::vector<float> in = RandomFloats(size_t(c.m) * stride, c.m * 7 + c.k, -4, 4);
    const std::vector<float> norm = RoundBf16(RandomFloats(c.k, c.k + 3, 0.5f, 1.5f));
    const std::vector<float> weight = RoundBf16(RandomFloats(size_t(c.n) * c.k, c.n + 5));
    const size_t out_count = size_t(c.m) * c.n;
    const std::vector<float> residual = RandomFloats(out_count, 98, -4, 4);

    auto run = [&](Backend& b, DeviceBuffer& in_buf, DeviceBuffer& norm_buf, DeviceBuffer& w,
                   DeviceBuffer& out, DType dtype) {
      MatmulParams p{out.as<float>(), in_buf.as<float>(), w.data(), dtype, c.m, c.n, c.k,
                     c.accumulate};
      p.prologue = c.prologue;
      p.in_stride = c.in_stride;
      if (silu) {
        p.up = in_buf.as<float>() + c.k;
        p.up_stride = stride;
      } else {
        p.norm_weight = norm_buf.data();
        p.norm_dtype = dtype;
        p.norm_eps = 1e-5f;
      }
      return b.Matmul(p);
    };
    DeviceBuffer cpu_in = Upload(cpu(), in);
    DeviceBuffer cpu_norm = Upload(cpu(), norm);
    DeviceBuffer cpu_w = Upload(cpu(), weight);
    DeviceBuffer cpu_out = c.accumulate ? Upload(cpu(), residual) : Poisoned(cpu(), out_count * 4);
    ASSERT_TRUE(run(cpu(), cpu_in, cpu_norm, cpu_w, cpu_out, DType::kF32).ok());
    DeviceBuffer gpu_in = Upload(gpu(), in);
    DeviceBuffer gpu_norm = OrDie(gpu().UploadWeights(norm.data(), norm.size()), "upload");
    DeviceBuffer gpu_w = OrDie(gpu().UploadWeights(weight.data(), weight.size()), "upload");
    DeviceBuffer gpu_out = c.accumulate ? Upload(gpu(), residual) : Poisoned(gpu(), out_count * 4);
    const absl::Status status = run(gpu(), gpu_in, gpu_norm, gpu_w, gpu_out, DType::kBF16);
    ASSERT_TRUE(status.ok()) << status;
    // The GPU multiplies the prologue's rows x rounded to bf16: up to 2^-9 of each term, at
    // random signs, so with weights uniform on [-1, 1] the error's spread is about
    // 2^-9 / 3 * |x|; allow six times that for the largest row. A missing 1 / rms, a wrong
    // norm weight or no SiLU errs by O(|x| / 2).
    double max_sq = 0;
    for (int r = 0; r < c.m; ++r) {
      const float* row = in.data() + size_t(r) * stride;
      double sq = 0, ms = 0;
      for (int i = 0; i < c.k; ++i) ms += double{row[i]} * row[i] / c.k;
      for (int i = 0; i < c.k; ++i) {
        const double g = row[i];
        const double x =
            silu ? g / (1 + std::exp(-g)) * row[c.k + i] : g / std::sqrt(ms + 1e-5) * norm[i];
        sq += x * x;
      }
      max_sq = std::max(max_sq, sq);
    }
    const double atol = std::sqrt(max_sq) / 256;
    EXPECT_TRUE(AllClose(DownloadFloats(gpu(), gpu_out.data(), out_count),
                         DownloadFloats(cpu(), cpu_out.data(), out_count), 1e-2, atol));
  }
};

TEST_F(MatmulPrologueTest, RmsNormBeforeTheProduct) {
  for (const PrologueCase& c : {
           PrologueCase{1, 512, 1024, MatmulPrologue::kRmsNorm, 0, false},
           PrologueCase{1, 20000, 4104, MatmulPrologue::kRmsNorm, 0, true},
           PrologueCase{5, 6144, 1024, MatmulPrologue::kRmsNorm, 1028, false},
           PrologueCase{8, 20000, 1024, MatmulPrologue::kRmsNorm, 0, true},
           PrologueCase{3, 512, 1024, MatmulPrologue::kRmsNorm, 1026, false},
           PrologueCase{9, 512, 1024, MatmulPrologue::kRmsNorm, 0, false},
           PrologueCase{64, 2048, 4096, MatmulPrologue::kRmsNorm, 4100, true},
       }) {
    Check(c);
  }
}

TEST_F(MatmulPrologueTest, SiluMulBeforeTheProduct) {
  for (const PrologueCase& c : {
           PrologueCase{1, 512, 1024, MatmulPrologue::kSiluMul, 2048, false},
           PrologueCase{1, 4096, 4104, MatmulPrologue::kSiluMul, 8208, true},
           PrologueCase{7, 6144, 1024, MatmulPrologue::kSiluMul, 2048, true},
           PrologueCase{8, 20000, 512, MatmulPrologue::kSiluMul, 1024, false},
           PrologueCase{2, 500, 1020, MatmulPrologue::kSiluMul, 2050, false},  // k % 8: cuBLAS
           PrologueCase{17, 512, 1024, MatmulPrologue::kSiluMul, 2048, false},
           PrologueCase{64, 4096, 2048, MatmulPrologue::kSiluMul, 4096, true},
       }) {
    Check(c);
  }
}

// A strided input without a prologue: the product of its rows packed densely (up to fp32
// summation order: strided rows take the cuBLAS path at any m).
TEST_F(MatmulTest, StridedInputOnBothPaths) {
  const int n = 512, k = 1024, stride = 1100;
  for (const int m : {3, 40}) {
    SCOPED_TRACE(testing::Message() << "m " << m);
    const std::vector<float> wide = RoundBf16(RandomFloats(size_t(m) * stride, m + 60));
    std::vector<float> dense(size_t(m) * k);
    for (int r = 0; r < m; ++r) {
      std::copy_n(wide.begin() + size_t(r) * stride, k, dense.begin() + size_t(r) * k);
    }
    const std::vector<float> weight = RoundBf16(RandomFloats(size_t(n) * k, 61));
    DeviceBuffer w = OrDie(gpu().UploadWeights(weight.data(), weight.size()), "upload");
    DeviceBuffer wide_in = Upload(gpu(), wide);
    DeviceBuffer dense_in = Upload(gpu(), dense);
    DeviceBuffer want = Poisoned(gpu(), size_t(m) * n * 4);
    DeviceBuffer got = Poisoned(gpu(), size_t(m) * n * 4);
    ASSERT_TRUE(
        gpu()
            .Matmul({want.as<float>(), dense_in.as<float>(), w.data(), DType::kBF16, m, n, k})
            .ok());
    MatmulParams p{got.as<float>(), wide_in.as<float>(), w.data(), DType::kBF16, m, n, k};
    p.in_stride = stride;
    const absl::Status s = gpu().Matmul(p);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(AllClose(DownloadFloats(gpu(), got.data(), size_t(m) * n),
                         DownloadFloats(gpu(), want.data(), size_t(m) * n), 1e-4,
                         3e-4 * std::sqrt(double(k))));
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
