#include "tools/random_model.h"

#include <cmath>
#include <optional>

#include "absl/strings/str_format.h"
#include "tools/device.h"

namespace kvd {

RandomFill RandomWeightFill(uint64_t seed, const WeightTensorInfo& info) {
  RandomFill fill;
  fill.key = RandomFillKey(seed, static_cast<uint64_t>(info.index));
  if (info.fan_in > 0) {
    // Uniform on [-a, a) has variance a^2 / 3.
    fill.scale = std::sqrt(3.0f / static_cast<float>(info.fan_in));
    fill.offset = 0.0f;
  } else {
    fill.scale = 0.1f;
    fill.offset = 1.0f;
  }
  return fill;
}

absl::StatusOr<std::unique_ptr<LlamaModel>> CreateRandomModel(
    const ModelSpec& spec, uint64_t seed, Backend* backend,
    std::optional<int64_t> host_bytes_available) {
  if (absl::Status s = spec.Validate(); !s.ok()) return s;
  const DType dtype = backend->weight_dtype();
  const size_t elem_bytes = static_cast<size_t>(DTypeBits(dtype) / 8);
  // Host memory past what is free would swap the machine or wake the OOM killer part way
  // through the fill: refused first (synthetic:llama3-8b is 32 GB of fp32).
  const int64_t bytes = spec.NumParameters() * static_cast<int64_t>(elem_bytes);
  if (host_bytes_available.has_value() && bytes > *host_bytes_available) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the model's %s weights need %d bytes (%.1f GiB) of host memory, and %d bytes "
        "(%.1f GiB) are available; use a GPU (--device cuda) or a smaller model",
        DTypeName(dtype), bytes, static_cast<double>(bytes) / (1 << 30), *host_bytes_available,
        static_cast<double>(*host_bytes_available) / (1 << 30)));
  }
  auto make = [&](const WeightTensorInfo& info) -> absl::StatusOr<DeviceBuffer> {
    const size_t count = static_cast<size_t>(info.count);
    auto buf = backend->Allocate(count * elem_bytes);
    if (!buf.ok()) return buf.status();
    if (absl::Status s =
            FillRandom(backend, buf->data(), dtype, count, RandomWeightFill(seed, info));
        !s.ok()) {
      return s;
    }
    return buf;
  };
  auto model = LlamaModel::CreateFromFactory(spec, backend, make);
  if (!model.ok()) return model.status();
  if (absl::Status s = backend->Synchronize(); !s.ok()) return s;
  return model;
}

}  // namespace kvd
