// Specification of CpuBackend as a whole: its memory functions, and that every op's
// output is bitwise identical whether it runs on 1, 2 or 7 threads.

#include "kernels/cpu_backend.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/kernels/kernel_test_util.h"

namespace kvd {
namespace {

using kernel_test::RandomFloats;
using kernel_test::TestArena;

TEST(CpuBackendTest, DescribesItselfAsFp32Cpu) {
  CpuBackend backend(4);
  EXPECT_EQ(backend.name(), "cpu");
  EXPECT_EQ(backend.weight_dtype(), DType::kF32);
  EXPECT_EQ(backend.num_threads(), 4);
  EXPECT_TRUE(backend.Synchronize().ok());
}

TEST(CpuBackendTest, AllocatesAlignedWritableMemoryOfEverySize) {
  CpuBackend backend(1);
  for (size_t bytes : {size_t{1}, size_t{63}, size_t{4096}, CpuBackend::kMmapThresholdBytes - 1,
                       CpuBackend::kMmapThresholdBytes, size_t{3} << 20}) {
    absl::StatusOr<DeviceBuffer> buf = backend.Allocate(bytes);
    ASSERT_TRUE(buf.ok()) << buf.status();
    EXPECT_EQ(buf->bytes(), bytes);
    ASSERT_NE(buf->data(), nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->data()) % 64, 0u) << bytes;
    std::memset(buf->data(), 0xAB, bytes);  // every byte is writable (ASan checks bounds)
    EXPECT_EQ(buf->as<unsigned char>()[bytes - 1], 0xAB);
  }
  absl::StatusOr<DeviceBuffer> empty = backend.Allocate(0);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->bytes(), 0u);
}

TEST(CpuBackendTest, CountsTheBytesOfItsLiveBuffers) {
  CpuBackend backend(1);
  EXPECT_EQ(backend.allocated_bytes(), 0);
  absl::StatusOr<DeviceBuffer> a = backend.Allocate(1000);
  absl::StatusOr<DeviceBuffer> b = backend.Allocate(size_t{3} << 20);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(backend.allocated_bytes(), 1000 + (int64_t{3} << 20));
  // A move hands the count on with the memory; only a free takes it out.
  DeviceBuffer moved = *std::move(b);
  EXPECT_EQ(backend.allocated_bytes(), 1000 + (int64_t{3} << 20));
  moved = *std::move(a);  // frees the 3 MiB buffer
  EXPECT_EQ(backend.allocated_bytes(), 1000);
  absl::StatusOr<DeviceBuffer> empty = backend.Allocate(0);
  EXPECT_EQ(backend.allocated_bytes(), 1000);
  moved.Reset();
  EXPECT_EQ(backend.allocated_bytes(), 0);
  // The CPU backend keeps no device memory of its own and has no device.
  EXPECT_EQ(backend.workspace_bytes(), 0);
  EXPECT_FALSE(backend.QueryDeviceMemory().has_value());
}

// Resident set size of this process, from /proc/self/statm (Linux).
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t total_pages = 0, resident_pages = 0;
  statm >> total_pages >> resident_pages;
  return resident_pages * sysconf(_SC_PAGESIZE);
}

TEST(CpuBackendTest, LargeAllocationIsCommittedOnlyWhereTouched) {
  CpuBackend backend(1);
  const size_t bytes = size_t{1} << 30;
  const int64_t before = ResidentBytes();
  absl::StatusOr<DeviceBuffer> big = backend.Allocate(bytes);
  ASSERT_TRUE(big.ok()) << big.status();
  for (size_t offset = 0; offset < bytes; offset += bytes / 8) big->as<char>()[offset] = 1;
  // 8 touched pages, not a GiB (slack for the allocator and the test runner).
  EXPECT_LT(ResidentBytes() - before, int64_t{64} << 20);
  EXPECT_EQ(big->as<char>()[bytes / 2], 1);
}

TEST(CpuBackendTest, CopiesAndUploadsRoundTrip) {
  CpuBackend backend(1);
  const std::vector<float> host = RandomFloats(1000, 3);
  absl::StatusOr<DeviceBuffer> weights = backend.UploadWeights(host.data(), host.size());
  ASSERT_TRUE(weights.ok());
  EXPECT_EQ(weights->bytes(), host.size() * sizeof(float));
  std::vector<float> back(host.size());
  ASSERT_TRUE(backend.CopyToHost(back.data(), weights->data(), weights->bytes()).ok());
  EXPECT_EQ(back, host);

  absl::StatusOr<DeviceBuffer> dev = backend.Allocate(host.size() * sizeof(float));
  ASSERT_TRUE(dev.ok());
  ASSERT_TRUE(backend.CopyToDevice(dev->data(), host.data(), dev->bytes()).ok());
  EXPECT_EQ(0, std::memcmp(dev->data(), host.data(), dev->bytes()));

  EXPECT_EQ(backend.CopyToHost(nullptr, host.data(), 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend.CopyToDevice(dev->data(), nullptr, 4).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(backend.CopyToDevice(nullptr, nullptr, 0).ok());
  EXPECT_EQ(backend.UploadWeights(nullptr, 3).status().code(), absl::StatusCode::kInvalidArgument);
}

// Runs every op once on fixed inputs and returns all outputs concatenated. The shapes are
// large enough that every op splits into several parallel chunks (cpu_elementwise.cc: at
// least 2^14 elements a chunk, so 170 rows of 96 for Embedding and RmsNorm, 256 of 64 for
// SiluMul, 128 tokens of 8 heads x 16 for Rope; cpu_kv_ops.cc: at least 64 KiB, so 256 rows
// for AppendKv and 51 block pairs for CopyBlocks here), so a chunk writing at the wrong
// offset changes the result.
std::vector<float> RunEveryOp(int num_threads) {
  CpuBackend backend(num_threads);
  std::vector<float> all;
  auto keep = [&all](const std::vector<float>& v) { all.insert(all.end(), v.begin(), v.end()); };
  const int rows = 600, dim = 96, n = 160;

  const std::vector<float> table = RandomFloats(40 * dim, 1);
  std::vector<int32_t> ids(rows);
  for (int i = 0; i < rows; ++i) ids[i] = (i * 7) % 40;
  std::vector<float> x(rows * dim);
  EXPECT_TRUE(
      backend.Embedding({x.data(), table.data(), DType::kF32, ids.data(), rows, dim, 40}).ok());
  keep(x);

  const std::vector<float> norm_w = RandomFloats(dim, 2);
  std::vector<float> xn(rows * dim);
  EXPECT_TRUE(backend.RmsNorm({xn.data(), x.data(), norm_w.data(), DType::kF32, rows, dim}).ok());
  keep(xn);

  const std::vector<float> w = RandomFloats(n * dim, 3);
  std::vector<float> y = RandomFloats(rows * n, 4);
  EXPECT_TRUE(
      backend.Matmul({y.data(), xn.data(), w.data(), DType::kF32, rows, n, dim, true}).ok());
  keep(y);

  std::vector<float> silu(rows * 64);
  EXPECT_TRUE(backend.SiluMul({silu.data(), y.data(), y.data() + 64, rows, 64, n, n}).ok());
  keep(silu);

  // Inside y's rows: q = 6 heads x 16 at 0, k = 2 x 16 at 96, v = 2 x 16 at 128.
  std::vector<int32_t> pos(rows);
  for (int i = 0; i < rows; ++i) pos[i] = 100 + 3 * i;
  EXPECT_TRUE(backend.Rope({y.data(), y.data() + 96, pos.data(), rows, 6, 2, 16, n, n}).ok());
  keep(y);

  TestArena arena(1, 2, 5, 16, 4, 10);  // 160 blocks of 5 slots
  std::vector<int64_t> slots(rows);
  for (int i = 0; i < rows; ++i) {
    slots[i] = i < 25 ? 79 - i : 80 + (i - 25);  // the first 25 backwards, for the attention
  }
  EXPECT_TRUE(
      backend.AppendKv({arena.View(0), y.data() + 96, y.data() + 128, slots.data(), rows, n, n})
          .ok());
  // Slots 55..79 = blocks 11..15 are full. Sequence 0: 13 prefill rows over 20 keys in
  // blocks 15, 14, 13, 12; sequence 1: one decode over block 11.
  const std::vector<int32_t> q_indptr = {0, 13, 14};
  const std::vector<int32_t> indptr = {0, 4, 5}, indices = {15, 14, 13, 12, 11};
  const std::vector<int32_t> last = {5, 5};
  std::vector<float> attn(14 * 96);
  PagedAttentionParams ap;
  ap.out = attn.data();
  ap.q = y.data();
  ap.q_indptr = q_indptr.data();
  ap.cache = arena.View(0);
  ap.blocks = {indptr.data(), indices.data(), last.data(), 2};
  ap.num_q_heads = 6;
  ap.q_stride = n;
  ap.out_stride = 96;
  ap.sm_scale = 0.25f;
  EXPECT_TRUE(backend.PagedAttention(ap).ok());
  keep(attn);

  // 60 pairs: blocks 16..75 (rows 0..24's and the next ones') to 100..159.
  std::vector<int32_t> src(60), dst(60);
  for (int i = 0; i < 60; ++i) {
    src[i] = 16 + i;
    dst[i] = 100 + i;
  }
  EXPECT_TRUE(backend.CopyBlocks(arena.CopyParams(src, dst)).ok());
  for (int c = 0; c < arena.num_chunks(); ++c) keep(arena.chunk(c));
  return all;
}

TEST(CpuBackendTest, EveryOpIsBitwiseIdenticalFor1And2And7Threads) {
  const std::vector<float> one = RunEveryOp(1);
  const std::vector<float> two = RunEveryOp(2);
  const std::vector<float> seven = RunEveryOp(7);
  ASSERT_EQ(one.size(), two.size());
  ASSERT_EQ(one.size(), seven.size());
  EXPECT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(one.data(), seven.data(), one.size() * sizeof(float)));
}

}  // namespace
}  // namespace kvd
