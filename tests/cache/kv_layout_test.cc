#include "cache/kv_layout.h"

#include <cstdint>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace kvd {
namespace {

constexpr KvShape kLlama3_8b{32, 8, 128};

TEST(KvLayoutTest, Bf16Llama3_8bNeeds128KiBPerToken) {
  const KvLayout l = *KvLayout::Create(kLlama3_8b, DType::kBF16, 16);
  EXPECT_EQ(l.data_bytes_per_token(), 131'072);
  EXPECT_EQ(l.region_block_bytes(), 8 * 16 * 128 * 2);
  EXPECT_EQ(l.block_bytes(), 16 * 131'072);
  EXPECT_EQ(l.block_scale_bytes(), 0);
  EXPECT_EQ(l.num_regions(), 64);
}

TEST(KvLayoutTest, RegionsAlternateKeyAndValuePerLayerInsideAChunk) {
  const KvLayout l = *KvLayout::Create(kLlama3_8b, DType::kBF16, 16);
  const int64_t region = l.region_bytes(64);
  EXPECT_EQ(region, 64 * l.region_block_bytes());
  EXPECT_EQ(l.k_offset_bytes(0, 64), 0);
  EXPECT_EQ(l.v_offset_bytes(0, 64), region);
  EXPECT_EQ(l.k_offset_bytes(3, 64), 6 * region);
  EXPECT_EQ(l.v_offset_bytes(31, 64), 63 * region);
  EXPECT_EQ(l.chunk_bytes(64), 64 * region);
}

TEST(KvLayoutTest, QuantizedDtypesCarryTheirScaleOverhead) {
  const int64_t h = 8, bs = 16, d = 128, regions = 64;
  const KvLayout fp8 = *KvLayout::Create(kLlama3_8b, DType::kFp8E4M3, 16);
  EXPECT_EQ(fp8.region_block_data_bytes(), h * bs * d);
  EXPECT_EQ(fp8.block_scale_bytes(), regions * h * 4);  // one fp32 per head per block
  const KvLayout int8 = *KvLayout::Create(kLlama3_8b, DType::kInt8, 16);
  EXPECT_EQ(int8.block_scale_bytes(), regions * h * bs * 4);  // one fp32 per token and head
  const KvLayout int4 = *KvLayout::Create(kLlama3_8b, DType::kInt4, 16);
  EXPECT_EQ(int4.region_block_data_bytes(), h * bs * d / 2);
  // fp16 scale + fp16 zero per group of 32 along head_dim.
  EXPECT_EQ(int4.block_scale_bytes(), regions * h * bs * (d / 32) * 4);
  EXPECT_DOUBLE_EQ(int4.bytes_per_token(), static_cast<double>(int4.block_bytes()) / 16);
  EXPECT_LT(int4.bytes_per_token(), int8.bytes_per_token());
  // Whole 16-byte units here, so a block is its elements and scales, nothing more.
  for (const KvLayout* l : {&fp8, &int8, &int4}) {
    EXPECT_TRUE(l->quantized());
    EXPECT_EQ(l->region_scale_offset_bytes(), l->region_block_data_bytes());
    EXPECT_EQ(l->region_block_bytes(),
              l->region_block_data_bytes() + l->region_block_scale_bytes());
    EXPECT_EQ(l->block_bytes(), l->block_data_bytes() + l->block_scale_bytes());
    EXPECT_EQ(l->chunk_bytes(8), 8 * l->block_bytes());
  }
}

// A quantized block's scales start, and its slot ends, on a 16-byte boundary; an unquantized
// block is its elements exactly, however few.
TEST(KvLayoutTest, QuantizedBlocksArePaddedTo16Bytes) {
  const KvLayout int8 = *KvLayout::Create({2, 1, 6}, DType::kInt8, 1);
  EXPECT_EQ(int8.region_block_data_bytes(), 6);
  EXPECT_EQ(int8.region_scale_offset_bytes(), 16);
  EXPECT_EQ(int8.region_block_scale_bytes(), 4);
  EXPECT_EQ(int8.region_block_bytes(), 32);
  EXPECT_EQ(int8.block_bytes(), 4 * 32);
  EXPECT_EQ(int8.data_bytes_per_token(), 4 * 6);
  EXPECT_DOUBLE_EQ(int8.bytes_per_token(), 4 * 32);
  const KvLayout f32 = *KvLayout::Create({2, 1, 3}, DType::kF32, 1);
  EXPECT_FALSE(f32.quantized());
  EXPECT_EQ(f32.region_block_bytes(), 12);
  EXPECT_EQ(f32.region_block_scale_bytes(), 0);
}

TEST(KvLayoutTest, RejectsShapesThatAreNotWholeBytes) {
  EXPECT_FALSE(KvLayout::Create({0, 8, 128}, DType::kBF16, 16).ok());
  EXPECT_FALSE(KvLayout::Create(kLlama3_8b, DType::kBF16, 0).ok());
  EXPECT_FALSE(KvLayout::Create({2, 1, 3}, DType::kInt4, 16).ok());   // 12 bits a head
  EXPECT_FALSE(KvLayout::Create({2, 1, 48}, DType::kInt4, 16).ok());  // groups of 32
  EXPECT_TRUE(KvLayout::Create({2, 1, 8}, DType::kInt4, 16).ok());    // one group of 8
}

TEST(KvLayoutTest, RejectsShapesWhoseSizesOverflow) {
  // Errors naming the shape, where the sizes would overflow (undefined behaviour).
  constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
  absl::StatusOr<KvLayout> l = KvLayout::Create({kMax, 8, 128}, DType::kBF16, 16);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(l.status().message().find("num_layers=2147483647"), std::string::npos) << l.status();
  l = KvLayout::Create({1 << 29, kMax, kMax}, DType::kF32, kMax);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(l.status().message().find("do not fit in 64 bits"), std::string::npos) << l.status();
  // The largest that fit still work.
  EXPECT_TRUE(KvLayout::Create({kMax / 2, 1, 8}, DType::kInt8, 1).ok());
}

TEST(KvLayoutTest, FingerprintSeparatesDtypesAndBlockSizes) {
  const KvLayout a = *KvLayout::Create(kLlama3_8b, DType::kBF16, 16);
  EXPECT_EQ(a.Fingerprint(), KvLayout::Create(kLlama3_8b, DType::kBF16, 16)->Fingerprint());
  EXPECT_NE(a.Fingerprint(), KvLayout::Create(kLlama3_8b, DType::kF16, 16)->Fingerprint());
  EXPECT_NE(a.Fingerprint(), KvLayout::Create(kLlama3_8b, DType::kBF16, 32)->Fingerprint());
}

}  // namespace
}  // namespace kvd
