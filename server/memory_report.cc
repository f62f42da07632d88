#include "server/memory_report.h"

#include "absl/strings/str_cat.h"
#include "server/pool_report.h"

namespace kvd {

std::string DescribeMemory(const MemoryStats& memory,
                           const std::optional<Backend::DeviceMemory>& device,
                           bool activations_reserved) {
  std::string line =
      absl::StrCat("kvd: memory: weights ", HumanBytes(memory.weights_bytes), ", KV pool ",
                   HumanBytes(memory.kv_pool_bytes), ", activations and other buffers ",
                   HumanBytes(memory.activation_bytes),
                   activations_reserved ? " (those of the largest step, held from the start)"
                                        : " (grown to the largest batch as it comes)",
                   ", backend workspace ", HumanBytes(memory.workspace_bytes));
  if (device.has_value()) {
    absl::StrAppend(&line, "; the device has ", HumanBytes(device->free_bytes), " free of ",
                    HumanBytes(device->total_bytes));
  }
  return line;
}

}  // namespace kvd
