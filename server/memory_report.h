#ifndef KVD_SERVER_MEMORY_REPORT_H_
#define KVD_SERVER_MEMORY_REPORT_H_

#include <optional>
#include <string>

#include "kernels/backend.h"
#include "scheduler/engine_stats.h"

namespace kvd {

// What `kvd serve` says at startup of where the backend's memory is, beside the KV pool's
// line (pool_report.h): "kvd: memory: weights ..., KV pool ..., activations and other buffers
// ..., backend workspace ...", then the device's free and total memory where it is known (no
// newline). The figures are those kvd_memory_bytes and kvd_device_memory_bytes publish.
// `activations_reserved`: the model holds the largest step's activations already
// (LlamaModel::ReserveActivations), rather than growing them as steps come.
std::string DescribeMemory(const MemoryStats& memory,
                           const std::optional<Backend::DeviceMemory>& device,
                           bool activations_reserved = false);

}  // namespace kvd

#endif  // KVD_SERVER_MEMORY_REPORT_H_
