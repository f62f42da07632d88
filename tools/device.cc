#include "tools/device.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu_backend.h"
#include "kernels/cuda/cuda_support.h"
#include "tools/cpu_count.h"
#if defined(KVD_HAVE_CUDA)
#include "kernels/cuda/cublas_api.h"
#include "kernels/cuda/cuda_backend.h"
#endif

namespace kvd {
namespace {

// A device name as typed, in lower case: names are case-insensitive, as the config's
// model.device.
std::string DeviceKey(std::string_view typed) {
  return absl::AsciiStrToLower(absl::string_view(typed.data(), typed.size()));
}

// Host staging per FillRandom round on backends without a fill kernel (4 MiB of f32).
constexpr size_t kFillChunkElements = size_t{1} << 20;

#if defined(KVD_HAVE_CUDA)
CudaBackend* AsCuda(Backend* backend) { return dynamic_cast<CudaBackend*>(backend); }

// OpGraphRecorder over CudaBackend's stream capture.
class CudaGraphRecorder final : public OpGraphRecorder {
 public:
  explicit CudaGraphRecorder(CudaBackend* backend) : backend_(backend) {}

  absl::Status BeginCapture() override { return backend_->BeginCapture(); }
  absl::StatusOr<std::unique_ptr<Graph>> EndCapture() override {
    auto graph = backend_->EndCapture();
    if (!graph.ok()) return graph.status();
    return std::unique_ptr<Graph>(new CudaGraph(backend_, *std::move(graph)));
  }
  uint64_t epoch() const override { return backend_->scratch_epoch(); }

 private:
  class CudaGraph final : public Graph {
   public:
    CudaGraph(CudaBackend* backend, CudaBackend::Graph graph)
        : backend_(backend), graph_(std::move(graph)) {}
    absl::Status Launch() override { return backend_->LaunchGraph(graph_); }

   private:
    CudaBackend* backend_;
    CudaBackend::Graph graph_;
  };

  CudaBackend* backend_;
};
#endif

}  // namespace

std::string_view DeviceName(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

bool BuiltWithCuda() {
#if defined(KVD_HAVE_CUDA)
  return true;
#else
  return false;
#endif
}

absl::StatusOr<DeviceChoice> ChooseDevice(std::string_view typed, const CudaProbe& probe) {
  const std::string name = DeviceKey(typed);
  if (name == "cpu") return DeviceChoice{Device::kCpu, ""};
  if (name != "cuda" && name != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("'", std::string(typed), "' is not one of cpu, cuda, auto"));
  }
  const bool is_auto = name == "auto";
  if (!probe.built) {
    if (is_auto) return DeviceChoice{Device::kCpu, "", true};
    return absl::FailedPreconditionError(
        "'cuda': this kvd was built without the CUDA backend (configure with a CUDA toolkit and "
        "KVD_CUDA=ON)");
  }
  if (!probe.devices.ok() || *probe.devices <= 0) {
    if (is_auto) return DeviceChoice{Device::kCpu, "", true};
    // The runtime's reason, where it gave one: a driver too old for this runtime reads as
    // "no GPU" otherwise.
    return absl::UnavailableError(absl::StrCat(
        "'cuda': no CUDA device is visible (no GPU or no driver)",
        probe.devices.ok() ? "" : absl::StrCat(": ", probe.devices.status().message())));
  }
  if (!probe.compute_capability.ok() || *probe.compute_capability < cuda::kMinComputeCapability) {
    const std::string why =
        probe.compute_capability.ok()
            ? absl::StrCat("GPU 0 ", cuda::ComputeCapabilityShortfall(*probe.compute_capability))
            : absl::StrCat("GPU 0's compute capability could not be read: ",
                           probe.compute_capability.status().message());
    if (is_auto) {
      return DeviceChoice{Device::kCpu,
                          absl::StrCat("a GPU is visible but the CUDA backend cannot run: ", why),
                          true};
    }
    return absl::FailedPreconditionError(absl::StrCat("'cuda': ", why));
  }
  if (!probe.cublas.ok()) {
    if (is_auto) {
      return DeviceChoice{Device::kCpu,
                          absl::StrCat("a GPU is visible but the CUDA backend cannot run: ",
                                       probe.cublas.message()),
                          true};
    }
    return absl::UnavailableError(absl::StrCat("'cuda': ", probe.cublas.message()));
  }
  return DeviceChoice{Device::kCuda, "", is_auto};
}

absl::StatusOr<DeviceChoice> FitDeviceToModel(const DeviceChoice& choice, int head_dim) {
  if (choice.device != Device::kCuda || cuda::HasAttentionKernel(head_dim)) return choice;
  const std::string why = absl::StrCat("the model's head_dim ", head_dim,
                                       " has no CUDA attention kernel (64 and 128, or up to ",
                                       cuda::kGenericAttentionMaxHeadDim, ")");
  if (choice.automatic) return DeviceChoice{Device::kCpu, why, true};
  return absl::FailedPreconditionError(absl::StrCat("'cuda': ", why, "; the CPU backend runs it"));
}

absl::StatusOr<DeviceChoice> ResolveDevice(std::string_view typed) {
  CudaProbe probe;
  probe.built = BuiltWithCuda();
#if defined(KVD_HAVE_CUDA)
  if (const std::string name = DeviceKey(typed); name == "cuda" || name == "auto") {
    probe.devices = CountCudaDevices();
    if (probe.devices.ok() && *probe.devices > 0) {
      probe.compute_capability = CudaComputeCapability(0);
      probe.cublas = LoadCublas().status();
    }
  }
#endif
  return ChooseDevice(typed, probe);
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(Device device, int cpu_threads) {
  if (device == Device::kCpu) {
    if (cpu_threads <= 0) cpu_threads = UsableCpus();
    return std::make_unique<CpuBackend>(cpu_threads);
  }
#if defined(KVD_HAVE_CUDA)
  auto cuda = CudaBackend::Create(/*device_index=*/0);
  if (!cuda.ok()) return cuda.status();
  return std::unique_ptr<Backend>(std::move(*cuda));
#else
  return absl::FailedPreconditionError("MakeBackend: this kvd was built without CUDA");
#endif
}

std::unique_ptr<OpGraphRecorder> MakeOpGraphRecorder([[maybe_unused]] Backend* backend) {
#if defined(KVD_HAVE_CUDA)
  if (CudaBackend* cuda = AsCuda(backend)) return std::make_unique<CudaGraphRecorder>(cuda);
#endif
  return nullptr;
}

DType DefaultKvDtype(const Backend& backend) {
  return backend.name() == "cuda" ? DType::kBF16 : DType::kF32;
}

absl::Span<const KvQuantization> KvQuantizationsOn(Device device) {
  static constexpr KvQuantization kCpu[] = {KvQuantization::kNone, KvQuantization::kInt8};
  static constexpr KvQuantization kCuda[] = {KvQuantization::kNone, KvQuantization::kBF16,
                                             KvQuantization::kInt8};
  if (device == Device::kCuda) return kCuda;
  return kCpu;
}

DType KvDtypeFor(KvQuantization quantization, DType native) {
  switch (quantization) {
    case KvQuantization::kNone:
      return native;
    case KvQuantization::kBF16:
      return DType::kBF16;
    case KvQuantization::kFP16:
      return DType::kF16;
    case KvQuantization::kFP8:
      return DType::kFp8E4M3;
    case KvQuantization::kInt8:
      return DType::kInt8;
    case KvQuantization::kInt4:
      return DType::kInt4;
  }
  return native;
}

absl::Status FillRandom(Backend* backend, void* data, DType dtype, size_t count,
                        const RandomFill& fill) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::UnimplementedError(
        absl::StrCat("FillRandom: dtype ", std::string(DTypeName(dtype)), " (f32 and bf16 only)"));
  }
#if defined(KVD_HAVE_CUDA)
  if (CudaBackend* cuda = AsCuda(backend)) return cuda->FillRandom(data, dtype, count, fill);
#endif
  const size_t elem_bytes = static_cast<size_t>(DTypeBits(dtype) / 8);
  std::vector<uint8_t> host(std::min(count, kFillChunkElements) * elem_bytes);
  for (size_t begin = 0; begin < count; begin += kFillChunkElements) {
    const size_t n = std::min(kFillChunkElements, count - begin);
    for (size_t i = 0; i < n; ++i) {
      const float v = RandomFillValue(fill, begin + i);
      if (dtype == DType::kF32) {
        std::memcpy(host.data() + i * 4, &v, 4);
      } else {
        const uint16_t b = Bf16Bits(v);
        std::memcpy(host.data() + i * 2, &b, 2);
      }
    }
    if (absl::Status s = backend->CopyToDevice(static_cast<uint8_t*>(data) + begin * elem_bytes,
                                               host.data(), n * elem_bytes);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace kvd
