#include "server/pool_report.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvd {

std::string HumanBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes < 1024) return absl::StrCat(bytes, " B");
  if (bytes < (int64_t{1} << 20)) return absl::StrFormat("%.1f KiB", b / 1024);
  if (bytes < (int64_t{1} << 30)) return absl::StrFormat("%.1f MiB", b / (1 << 20));
  return absl::StrFormat("%.2f GiB", b / (int64_t{1} << 30));
}

PoolReport DescribePool(const KvPoolGeometry& geometry, int64_t block_bytes, int32_t block_size,
                        int32_t context_tokens, std::optional<int64_t> host_bytes_available) {
  const int64_t initial_bytes = int64_t{geometry.initial_chunks} * geometry.chunk_bytes;
  const int64_t max_bytes = int64_t{geometry.max_chunks} * geometry.chunk_bytes;
  const int64_t max_blocks = geometry.max_blocks();
  const int64_t max_tokens = max_blocks * block_size;
  PoolReport r;
  const int32_t per_chunk = geometry.blocks_per_chunk();
  r.line = absl::StrCat("kvd: KV pool: ", HumanBytes(initial_bytes),
                        " reserved now (memory_pool.initial_size, at least one chunk), up to ",
                        HumanBytes(max_bytes), " (max_size), in chunks of ",
                        HumanBytes(geometry.chunk_bytes), " (", per_chunk,
                        per_chunk == 1 ? " block" : " blocks", " of ", HumanBytes(block_bytes),
                        "): at most ", max_blocks, " blocks, ", max_tokens, " tokens");
  if (max_tokens < context_tokens) {
    r.warnings.push_back(absl::StrCat(
        "kvd: warning: the KV pool holds ", max_tokens, " tokens at max_size, fewer than one ",
        context_tokens,
        "-token context: a request whose prompt and max_tokens need more KV is refused "
        "(RESOURCE_EXHAUSTED); raise kv_cache_config.memory_pool.max_size or lower "
        "kv_cache_config.max_seq_length"));
  }
  if (host_bytes_available.has_value() && max_bytes > *host_bytes_available) {
    r.warnings.push_back(absl::StrCat(
        "kvd: warning: kv_cache_config.memory_pool.max_size lets the KV pool grow to ",
        HumanBytes(max_bytes), ", more than the host's available memory (",
        HumanBytes(*host_bytes_available),
        "): it grows until an allocation fails (kvd_kv_pool_growth_failures_total) or the "
        "kernel's OOM killer ends the process"));
  }
  return r;
}

std::optional<std::string> DeviceRoomWarning(int64_t max_bytes, int64_t reserved_bytes,
                                             int64_t free_bytes, int64_t headroom_bytes) {
  const int64_t room = reserved_bytes + std::max<int64_t>(0, free_bytes - headroom_bytes);
  if (max_bytes <= room) return std::nullopt;
  return absl::StrCat(
      "kvd: warning: kv_cache_config.memory_pool.max_size lets the KV pool grow to ",
      HumanBytes(max_bytes), ", more than the device has room for: ", HumanBytes(room), " (the ",
      HumanBytes(reserved_bytes), " reserved, and the ", HumanBytes(free_bytes),
      " free now less memory_pool.device_headroom's ", HumanBytes(headroom_bytes),
      "); it stops growing about there (kvd_kv_pool_growth_failures_total)");
}

}  // namespace kvd
