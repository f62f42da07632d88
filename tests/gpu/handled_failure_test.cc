// A CUDA failure that CudaBackend has reported is not reported again: the runtime keeps the
// last error until it is read, and launchers read it after their launch, so a failed
// cudaMalloc, handled by its caller (the KV pool stops growing at the end of device memory),
// must not fail the next valid op. Each launcher of the backend runs right after such a
// failure and must succeed.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/params.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/twin_arena.h"

namespace kvd::gpu_test {
namespace {

using HandledFailureTest = GpuVsCpuTest;

// Allocates more than any device has (256 TiB): ResourceExhausted, as when the KV pool grows
// into the end of device memory.
void FailAnAllocation(CudaBackend& gpu) {
  const absl::StatusOr<DeviceBuffer> huge = gpu.Allocate(size_t{1} << 48);
  ASSERT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
}

TEST_F(HandledFailureTest, OpsAfterAFailedAllocationSucceed) {
  // More rows than a decode batch: cuBLAS, after the input is converted to bf16.
  const int m = 32, n = 64, k = 64;
  const std::vector<float> weights = RandomFloats(size_t{n} * k, 1);
  DeviceBuffer in = Upload(gpu(), RandomFloats(size_t{m} * k, 2));
  DeviceBuffer out = Poisoned(gpu(), sizeof(float) * m * n);

  FailAnAllocation(gpu());
  absl::StatusOr<DeviceBuffer> w = gpu().UploadWeights(weights.data(), weights.size());
  ASSERT_TRUE(w.ok()) << w.status();

  FailAnAllocation(gpu());
  const absl::Status matmul = gpu().Matmul({.out = out.as<float>(),
                                            .in = in.as<float>(),
                                            .weight = w->data(),
                                            .weight_dtype = DType::kBF16,
                                            .m = m,
                                            .n = n,
                                            .k = k});
  EXPECT_TRUE(matmul.ok()) << matmul;

  FailAnAllocation(gpu());
  const absl::Status fill =
      gpu().FillRandom(out.data(), DType::kF32, size_t{m} * n, RandomFill{.key = 7, .scale = 1.0f});
  EXPECT_TRUE(fill.ok()) << fill;

  ArenaShape two_layers;
  two_layers.num_layers = 2;
  two_layers.num_chunks = 2;
  TwinArena arena(cpu(), gpu(), two_layers);
  const std::vector<int32_t> src = {1}, dst = {6};
  DeviceBuffer gpu_src = Upload(gpu(), src), gpu_dst = Upload(gpu(), dst);
  FailAnAllocation(gpu());
  const absl::Status copy = gpu().CopyBlocks({.chunks = arena.gpu_table(),
                                              .chunk_shift = arena.shape().chunk_shift,
                                              .chunk_region_bytes = arena.RegionBytes(true),
                                              .num_regions = 2 * arena.shape().num_layers,
                                              .block_bytes = arena.BlockBytes(true),
                                              .src = gpu_src.as<int32_t>(),
                                              .dst = gpu_dst.as<int32_t>(),
                                              .num_pairs = 1});
  EXPECT_TRUE(copy.ok()) << copy;
  const absl::Status sync = gpu().Synchronize();
  EXPECT_TRUE(sync.ok()) << sync;
}

// PagedAttention over a batch with prefill rows, on each kernel family below Hopper's: f32 KV
// (the fp32 prefill kernel), bf16 KV with head_dim 64 on a small batch (the 64-row mma
// kernel), and a head_dim without a fast kernel (the generic one).
TEST_F(HandledFailureTest, AttentionAfterAFailedAllocationSucceeds) {
  struct Case {
    DType dtype;
    int head_dim;
  };
  for (const Case& c : {Case{DType::kF32, 64}, Case{DType::kBF16, 64}, Case{DType::kF32, 32}}) {
    SCOPED_TRACE(testing::Message() << DTypeName(c.dtype) << " head_dim " << c.head_dim);
    const int num_kv_heads = 2, num_q_heads = 4, block_size = 16;
    const int kv_len = 40, q_len = 8;
    ArenaShape shape;
    shape.num_layers = 1;
    shape.num_kv_heads = num_kv_heads;
    shape.head_dim = c.head_dim;
    shape.block_size = block_size;
    shape.chunk_shift = 2;
    shape.num_chunks = 1;
    shape.gpu_dtype = c.dtype;
    TwinArena arena(cpu(), gpu(), shape);
    // One sequence over blocks 0, 1, 2, every key and value written.
    const int kv_row = num_kv_heads * c.head_dim, q_row = num_q_heads * c.head_dim;
    std::vector<int64_t> slots(kv_len);
    for (int t = 0; t < kv_len; ++t) slots[t] = t;
    DeviceBuffer k = Upload(gpu(), RoundBf16(RandomFloats(size_t{kv_len} * kv_row, 3)));
    DeviceBuffer v = Upload(gpu(), RoundBf16(RandomFloats(size_t{kv_len} * kv_row, 4)));
    DeviceBuffer gpu_slots = Upload(gpu(), slots);
    FailAnAllocation(gpu());
    const absl::Status append = gpu().AppendKv({.cache = arena.GpuView(0),
                                                .k = k.as<float>(),
                                                .v = v.as<float>(),
                                                .slot_mapping = gpu_slots.as<int64_t>(),
                                                .num_tokens = kv_len,
                                                .k_stride = kv_row,
                                                .v_stride = kv_row});
    EXPECT_TRUE(append.ok()) << append;

    DeviceBuffer q = Upload(gpu(), RandomFloats(size_t{q_len} * q_row, 5));
    DeviceBuffer out = Poisoned(gpu(), sizeof(float) * q_len * q_row);
    DeviceBuffer q_indptr = Upload(gpu(), std::vector<int32_t>{0, q_len});
    DeviceBuffer indptr = Upload(gpu(), std::vector<int32_t>{0, 3});
    DeviceBuffer indices = Upload(gpu(), std::vector<int32_t>{0, 1, 2});
    DeviceBuffer last = Upload(gpu(), std::vector<int32_t>{kv_len - 2 * block_size});
    PagedAttentionParams p;
    p.out = out.as<float>();
    p.q = q.as<float>();
    p.q_indptr = q_indptr.as<int32_t>();
    p.cache = arena.GpuView(0);
    p.blocks = {.indptr = indptr.as<int32_t>(),
                .indices = indices.as<int32_t>(),
                .last_block_len = last.as<int32_t>(),
                .num_seqs = 1};
    p.num_q_heads = num_q_heads;
    p.q_stride = q_row;
    p.out_stride = q_row;
    p.sm_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    p.max_q_len = q_len;
    FailAnAllocation(gpu());
    const absl::Status attention = gpu().PagedAttention(p);
    EXPECT_TRUE(attention.ok()) << attention;
    const absl::Status sync = gpu().Synchronize();
    EXPECT_TRUE(sync.ok()) << sync;
    for (float x : DownloadFloats(gpu(), out.data(), size_t{q_len} * q_row)) {
      ASSERT_TRUE(std::isfinite(x));
    }
  }
}

// The engine stops on DataLoss (Backend's contract): only the errors the runtime calls sticky
// (the context is lost) are DataLoss; a failure the backend survives is not.
TEST(CudaStatusTest, OnlyStickyErrorsAreDataLoss) {
  for (cudaError_t sticky :
       {cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorMisalignedAddress,
        cudaErrorIllegalInstruction, cudaErrorAssert, cudaErrorHardwareStackError}) {
    const absl::Status s = CudaStatus(sticky, "op");
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find("context is lost"), absl::string_view::npos) << s;
  }
  EXPECT_EQ(CudaStatus(cudaErrorMemoryAllocation, "op").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CudaStatus(cudaErrorInvalidValue, "op").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaStatus(cudaErrorNotReady, "op").code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(CudaStatus(cudaSuccess, "op").ok());
}

}  // namespace
}  // namespace kvd::gpu_test
