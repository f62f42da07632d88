#include "tools/random_model.h"

#include <cmath>

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

absl::StatusOr<std::unique_ptr<LlamaModel>> CreateRandomModel(const ModelSpec& spec, uint64_t seed,
                                                              Backend* backend) {
  const DType dtype = backend->weight_dtype();
  const size_t elem_bytes = static_cast<size_t>(DTypeBits(dtype) / 8);
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
