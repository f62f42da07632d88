#ifndef KVD_SERVER_POOL_REPORT_H_
#define KVD_SERVER_POOL_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cache/kv_cache_options.h"

namespace kvd {

// What `kvd serve` says about its KV pool at startup, so an operator can see where the
// memory goes before the first request: the pool's size now and at most, its chunks, and
// what that holds in blocks and tokens; and warnings for a pool that cannot hold one
// sequence of the context, or (host memory) could grow past what the host has available.
struct PoolReport {
  std::string line;                   // "kvd: KV pool: ..." (no newline)
  std::vector<std::string> warnings;  // "kvd: warning: ..." each (no newline)
};

// `block_bytes`: one block, all layers, K and V; `context_tokens`: the positions a request
// may use (the model's context capped by max_seq_length); `host_bytes_available`: given when
// the pool lives in host memory (the CPU backend) and the host says what is available.
PoolReport DescribePool(const KvPoolGeometry& geometry, int64_t block_bytes, int32_t block_size,
                        int32_t context_tokens, std::optional<int64_t> host_bytes_available);

// On a device backend, the warning that the pool's max_size is more than the device has room
// for, or none: `reserved_bytes` the arena holds now, `free_bytes` the device's free memory
// now, `headroom_bytes` what the arena leaves free (memory_pool.device_headroom). The pool
// can grow to the reserve plus what is free beyond the headroom.
std::optional<std::string> DeviceRoomWarning(int64_t max_bytes, int64_t reserved_bytes,
                                             int64_t free_bytes, int64_t headroom_bytes);

// Bytes for people: "512 B", "20.0 KiB", "10.0 MiB", "8.00 GiB".
std::string HumanBytes(int64_t bytes);

}  // namespace kvd

#endif  // KVD_SERVER_POOL_REPORT_H_
