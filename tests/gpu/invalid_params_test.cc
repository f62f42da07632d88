// CudaBackend's checks of op parameters: a bad size or stride is InvalidArgument, and the
// message names the op, the field and its value, before anything is launched.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "kernels/params.h"
#include "tests/gpu/gpu_test_util.h"

namespace kvd::gpu_test {
namespace {

using InvalidParamsTest = GpuVsCpuTest;

// InvalidArgument whose message starts with the op's name and names the field and value.
::testing::AssertionResult RejectedNaming(const absl::Status& s, const std::string& op,
                                          const std::string& field_and_value) {
  return FailedWith(s, absl::StatusCode::kInvalidArgument, op + ": ", field_and_value);
}

// A one-chunk bf16 KV view of one block per chunk: 16 tokens of head_dim 64 per KV head.
KvCacheView Bf16View(void* const* chunks, int32_t num_kv_heads) {
  return {.chunks = chunks,
          .num_chunks = 1,
          .chunk_shift = 0,
          .block_bytes = int64_t{num_kv_heads} * 16 * 64 * 2,
          .dtype = DType::kBF16,
          .num_kv_heads = num_kv_heads,
          .block_size = 16,
          .head_dim = 64};
}

TEST_F(InvalidParamsTest, BadSizesAreRejectedNamingTheValue) {
  // Pointers that are never dereferenced: every call below fails its checks first.
  DeviceBuffer scratch = Poisoned(gpu(), 4096);
  float* any = scratch.as<float>();

  EXPECT_TRUE(RejectedNaming(gpu().Embedding(EmbeddingParams{.out = any,
                                                             .table = any,
                                                             .table_dtype = DType::kF32,
                                                             .token_ids = scratch.as<int32_t>(),
                                                             .num_tokens = 2,
                                                             .dim = 0,
                                                             .vocab_size = 10}),
                             "Embedding", "dim 0"));
  EXPECT_TRUE(RejectedNaming(
      gpu().RmsNorm(RmsNormParams{.out = any, .in = any, .weight = any, .num_rows = -1, .dim = 8}),
      "RmsNorm", "num_rows -1"));
  EXPECT_TRUE(RejectedNaming(gpu().Matmul(MatmulParams{.out = any,
                                                       .in = any,
                                                       .weight = any,
                                                       .weight_dtype = DType::kBF16,
                                                       .m = 1,
                                                       .n = 4,
                                                       .k = 0}),
                             "Matmul", "k 0"));
  EXPECT_TRUE(RejectedNaming(
      gpu().Rope(RopeParams{
          .q = any, .k = any, .num_tokens = 1, .num_q_heads = 1, .num_kv_heads = 1, .head_dim = 3}),
      "Rope", "head_dim 3"));
  EXPECT_TRUE(RejectedNaming(
      gpu().SiluMul(SiluMulParams{.out = any, .gate = any, .up = any, .num_rows = 1, .dim = -2}),
      "SiluMul", "dim -2"));
  EXPECT_TRUE(RejectedNaming(
      gpu().Sample(SampleParams{.logits = any, .row_stride = 5, .num_rows = 1, .vocab_size = 6}),
      "Sample", "row_stride 5 < vocab_size 6"));
  void* const chunks[1] = {scratch.data()};
  EXPECT_TRUE(RejectedNaming(gpu().CopyBlocks(CopyBlocksParams{.chunks = chunks,
                                                               .num_regions = 70000,
                                                               .block_bytes = 16,
                                                               .src = scratch.as<int32_t>(),
                                                               .dst = scratch.as<int32_t>(),
                                                               .num_pairs = 1}),
                             "CopyBlocks", "num_regions 70000"));
  // The checks shared with the CPU backend (kernels/backend.h).
  EXPECT_TRUE(RejectedNaming(gpu().SiluMul(SiluMulParams{.out = any,
                                                         .gate = any,
                                                         .up = any + 4,
                                                         .num_rows = 2,
                                                         .dim = 4,
                                                         .gate_stride = 8,
                                                         .up_stride = 8}),
                             "SiluMul", "out overlaps gate"));
  EXPECT_TRUE(RejectedNaming(gpu().CopyBlocks(CopyBlocksParams{.chunks = chunks,
                                                               .chunk_region_bytes = 64,
                                                               .num_regions = 2,
                                                               .block_bytes = int64_t{1} << 62,
                                                               .src = scratch.as<int32_t>(),
                                                               .dst = scratch.as<int32_t>(),
                                                               .num_pairs = 1}),
                             "CopyBlocks", "chunk_region_bytes (64)"));

  // The KV view every cache op checks, then each op's own fields.
  const KvCacheView view = Bf16View(chunks, /*num_kv_heads=*/2);
  KvCacheView bad_shift = view;
  bad_shift.chunk_shift = 31;
  EXPECT_TRUE(RejectedNaming(
      gpu().AppendKv(AppendKvParams{.cache = bad_shift, .k = any, .v = any, .num_tokens = 1}),
      "AppendKv", "chunk_shift 31"));
  KvCacheView no_heads = view;
  no_heads.num_kv_heads = 0;
  EXPECT_TRUE(RejectedNaming(
      gpu().AppendKv(AppendKvParams{.cache = no_heads, .k = any, .v = any, .num_tokens = 1}),
      "AppendKv", "num_kv_heads 0"));
  EXPECT_TRUE(RejectedNaming(
      gpu().AppendKv(AppendKvParams{.cache = view, .k = any, .v = any, .num_tokens = -5}),
      "AppendKv", "num_tokens -5"));

  PagedAttentionParams attention;
  attention.out = any;
  attention.q = any;
  attention.q_indptr = scratch.as<int32_t>();
  attention.blocks.indptr = attention.blocks.indices = attention.blocks.last_block_len =
      scratch.as<int32_t>();
  attention.cache = view;
  attention.num_q_heads = 4;
  attention.q_stride = 4 * 64 - 1;
  attention.out_stride = 4 * 64;
  attention.blocks.num_seqs = 1;
  EXPECT_TRUE(RejectedNaming(gpu().PagedAttention(attention), "PagedAttention", "q_stride 255"));
  attention.q_stride = 4 * 64;
  attention.blocks.num_seqs = 70000;
  EXPECT_TRUE(
      RejectedNaming(gpu().PagedAttention(attention), "PagedAttention", "num_seqs 70000 > 65535"));
  attention.blocks.num_seqs = 1;
  attention.cache.k_offset_bytes = 8;
  EXPECT_TRUE(
      RejectedNaming(gpu().PagedAttention(attention), "PagedAttention", "k_offset_bytes 8"));
}

// Rope and AppendKv check what the CPU reference checks (ValidateRope, ValidateAppendKvRows in
// kernels/backend.h) before anything is launched: a missing or narrow row, a bad theta or
// style is refused, not rotated or written.
TEST_F(InvalidParamsTest, RopeAndAppendKvRefuseWhatTheCpuBackendRefuses) {
  DeviceBuffer scratch = Poisoned(gpu(), 4096);
  float* any = scratch.as<float>();
  const RopeParams rope{.q = any,
                        .k = any,
                        .positions = scratch.as<int32_t>(),
                        .num_tokens = 2,
                        .num_q_heads = 2,
                        .num_kv_heads = 1,
                        .head_dim = 8,
                        .q_stride = 24,
                        .k_stride = 24};
  auto rope_with = [&](auto change) {
    RopeParams p = rope;
    change(p);
    return gpu().Rope(p);
  };
  EXPECT_TRUE(RejectedNaming(rope_with([](RopeParams& p) { p.theta = 0.0f; }), "Rope", "theta"));
  EXPECT_TRUE(RejectedNaming(rope_with([](RopeParams& p) { p.style = static_cast<RopeStyle>(7); }),
                             "Rope", "style 7"));
  EXPECT_TRUE(RejectedNaming(rope_with([](RopeParams& p) { p.positions = nullptr; }), "Rope",
                             "positions is null"));
  EXPECT_TRUE(RejectedNaming(rope_with([](RopeParams& p) { p.q = nullptr; }), "Rope", "q is null"));
  EXPECT_TRUE(RejectedNaming(rope_with([](RopeParams& p) { p.k = nullptr; }), "Rope", "k is null"));
  EXPECT_TRUE(
      RejectedNaming(rope_with([](RopeParams& p) { p.q_stride = 15; }), "Rope", "q_stride 15"));
  EXPECT_TRUE(
      RejectedNaming(rope_with([](RopeParams& p) { p.k_stride = 7; }), "Rope", "k_stride 7"));
  EXPECT_TRUE(RejectedNaming(rope_with([](RopeParams& p) { p.num_q_heads = p.num_kv_heads = 0; }),
                             "Rope", "not both 0"));

  void* const chunks[1] = {scratch.data()};
  const AppendKvParams append{.cache = {.chunks = chunks,
                                        .num_chunks = 1,
                                        .chunk_shift = 0,
                                        .block_bytes = 2 * 16 * 64 * 2,
                                        .dtype = DType::kBF16,
                                        .num_kv_heads = 2,
                                        .block_size = 16,
                                        .head_dim = 64},
                              .k = any,
                              .v = any,
                              .slot_mapping = scratch.as<int64_t>(),
                              .num_tokens = 1,
                              .k_stride = 128,
                              .v_stride = 128};
  auto append_with = [&](auto change) {
    AppendKvParams p = append;
    change(p);
    return gpu().AppendKv(p);
  };
  EXPECT_TRUE(RejectedNaming(append_with([](AppendKvParams& p) { p.v = nullptr; }), "AppendKv",
                             "v is null"));
  EXPECT_TRUE(RejectedNaming(append_with([](AppendKvParams& p) { p.slot_mapping = nullptr; }),
                             "AppendKv", "slot_mapping is null"));
  EXPECT_TRUE(RejectedNaming(append_with([](AppendKvParams& p) { p.v_stride = 127; }), "AppendKv",
                             "v_stride (127)"));
}

// PagedAttention refuses on the host what the CPU reference refuses on the host
// (ValidatePagedAttentionArgs): null output, query or block-table arrays and a negative
// max_q_len or max_kv_len, naming the field, before anything is launched. The batch has no query
// row (q_len 0), so a launch that slipped through would touch none of the null pointers and return
// OK (with a query row it would fault and lose the context).
TEST_F(InvalidParamsTest, PagedAttentionRefusesWhatTheCpuBackendRefuses) {
  DeviceBuffer scratch = Poisoned(gpu(), 4096);
  DeviceBuffer table = Upload(gpu(), std::vector<void*>{scratch.data()});
  DeviceBuffer q_indptr = Upload(gpu(), std::vector<int32_t>{0, 0});
  DeviceBuffer indptr = Upload(gpu(), std::vector<int32_t>{0, 1});
  DeviceBuffer indices = Upload(gpu(), std::vector<int32_t>{0});
  DeviceBuffer last = Upload(gpu(), std::vector<int32_t>{1});
  PagedAttentionParams ok;
  ok.out = scratch.as<float>();
  ok.q = scratch.as<float>();
  ok.q_indptr = q_indptr.as<int32_t>();
  ok.cache = Bf16View(table.as<void* const>(), /*num_kv_heads=*/1);
  ok.blocks = {.indptr = indptr.as<int32_t>(),
               .indices = indices.as<int32_t>(),
               .last_block_len = last.as<int32_t>(),
               .num_seqs = 1};
  ok.num_q_heads = 1;
  ok.q_stride = ok.out_stride = 64;
  ASSERT_TRUE(gpu().PagedAttention(ok).ok());  // the valid batch runs (and writes nothing)
  const auto with = [&](auto change) {
    PagedAttentionParams p = ok;
    change(p);
    return gpu().PagedAttention(p);
  };
  EXPECT_TRUE(RejectedNaming(with([](PagedAttentionParams& p) { p.out = nullptr; }),
                             "PagedAttention", "out is null"));
  EXPECT_TRUE(RejectedNaming(with([](PagedAttentionParams& p) { p.q = nullptr; }), "PagedAttention",
                             "q is null"));
  EXPECT_TRUE(RejectedNaming(with([](PagedAttentionParams& p) { p.q_indptr = nullptr; }),
                             "PagedAttention", "q_indptr is null"));
  EXPECT_TRUE(RejectedNaming(with([](PagedAttentionParams& p) { p.blocks.indices = nullptr; }),
                             "PagedAttention", "blocks.indices is null"));
  EXPECT_TRUE(RejectedNaming(with([](PagedAttentionParams& p) { p.max_q_len = -1; }),
                             "PagedAttention", "max_q_len is -1"));
  EXPECT_TRUE(RejectedNaming(with([](PagedAttentionParams& p) { p.max_kv_len = -1; }),
                             "PagedAttention", "max_kv_len is -1"));
  EXPECT_TRUE(gpu().Synchronize().ok());
}

// Embedding and RmsNorm refuse a null array, as the CPU reference does (kernels/cpu_elementwise.h),
// naming it: launched, the kernel would fault and leave the context unusable, so the
// Synchronize at the end fails if any call slipped through. With no rows nothing is read.
TEST_F(InvalidParamsTest, EmbeddingAndRmsNormRefuseANullArray) {
  DeviceBuffer scratch = Upload(gpu(), std::vector<float>(64, 0.0f));
  float* any = scratch.as<float>();
  const EmbeddingParams embedding{.out = any,
                                  .table = any,
                                  .table_dtype = DType::kF32,
                                  .token_ids = scratch.as<int32_t>(),  // zeros: id 0
                                  .num_tokens = 2,
                                  .dim = 8,
                                  .vocab_size = 4};
  ASSERT_TRUE(gpu().Embedding(embedding).ok());
  const auto embedding_with = [&](auto change) {
    EmbeddingParams p = embedding;
    change(p);
    return gpu().Embedding(p);
  };
  EXPECT_TRUE(RejectedNaming(embedding_with([](EmbeddingParams& p) { p.out = nullptr; }),
                             "Embedding", "out is null"));
  EXPECT_TRUE(RejectedNaming(embedding_with([](EmbeddingParams& p) { p.table = nullptr; }),
                             "Embedding", "table is null"));
  EXPECT_TRUE(RejectedNaming(embedding_with([](EmbeddingParams& p) { p.token_ids = nullptr; }),
                             "Embedding", "token_ids is null"));
  EXPECT_TRUE(embedding_with([](EmbeddingParams& p) {
                p.num_tokens = 0;
                p.out = nullptr;
                p.table = nullptr;
                p.token_ids = nullptr;
              }).ok());

  const RmsNormParams norm{.out = any, .in = any, .weight = any, .num_rows = 2, .dim = 8};
  ASSERT_TRUE(gpu().RmsNorm(norm).ok());
  const auto norm_with = [&](auto change) {
    RmsNormParams p = norm;
    change(p);
    return gpu().RmsNorm(p);
  };
  EXPECT_TRUE(RejectedNaming(norm_with([](RmsNormParams& p) { p.out = nullptr; }), "RmsNorm",
                             "out is null"));
  EXPECT_TRUE(
      RejectedNaming(norm_with([](RmsNormParams& p) { p.in = nullptr; }), "RmsNorm", "in is null"));
  EXPECT_TRUE(RejectedNaming(norm_with([](RmsNormParams& p) { p.weight = nullptr; }), "RmsNorm",
                             "weight is null"));
  EXPECT_TRUE(norm_with([](RmsNormParams& p) {
                p.num_rows = 0;
                p.out = nullptr;
                p.in = nullptr;
                p.weight = nullptr;
              }).ok());
  EXPECT_TRUE(gpu().Synchronize().ok());
}

// An empty op is a no-op whatever its view, on the CPU (kernels/cpu_kv_ops.h) and here; a
// negative count is refused.
TEST_F(InvalidParamsTest, EmptyAppendAndAttentionAreNoOpsWhateverTheView) {
  EXPECT_TRUE(gpu().AppendKv({}).ok());
  EXPECT_TRUE(gpu().PagedAttention({}).ok());
  PagedAttentionParams negative;
  negative.blocks.num_seqs = -1;
  EXPECT_TRUE(RejectedNaming(gpu().PagedAttention(negative), "PagedAttention", "num_seqs -1"));
}

}  // namespace
}  // namespace kvd::gpu_test
