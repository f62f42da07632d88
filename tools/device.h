#ifndef KVD_TOOLS_DEVICE_H_
#define KVD_TOOLS_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "config/config_enums.h"
#include "kernels/backend.h"
#include "kernels/cuda/random_fill.h"
#include "kernels/dtype.h"
#include "model/llama_model.h"

namespace kvd {

// The device the engine runs on (`--device cpu|cuda|auto` of `kvd generate` and the
// benchmarks), and the few device-side helpers the tools need beyond Backend's ops. The
// CUDA parts exist only in builds with the CUDA backend (KVD_HAVE_CUDA); a CPU-only build
// compiles the same API and refuses "cuda" with a clear error. All functions are
// stateless; those taking a Backend are not thread safe (one thread drives a backend).
enum class Device { kCpu, kCuda };

// "cpu" or "cuda".
std::string_view DeviceName(Device device);

// When "auto" picks CUDA (ChooseDevice, then FitDeviceToModel), as the commands' --help says.
inline constexpr char kAutoPicksCuda[] =
    "cuda on a GPU of compute capability 9.0+ where cuBLAS loads and the model's head_dim has "
    "a kernel";

// True when this binary was built with the CUDA backend.
bool BuiltWithCuda();

// What the machine offers the CUDA backend, as ResolveDevice finds it.
struct CudaProbe {
  bool built = false;               // this binary has the CUDA backend
  absl::StatusOr<int> devices = 0;  // GPUs visible, or why the runtime could not count them
  absl::Status cublas;              // whether the cuBLAS libraries load (asked only with a GPU)
  // GPU 0's compute capability, major * 10 + minor (asked only with a GPU), or why it could
  // not be read.
  absl::StatusOr<int> compute_capability = 0;
};

// A resolved device name.
struct DeviceChoice {
  Device device = Device::kCpu;
  // Set when "auto" runs on the CPU although a GPU is visible: why (the CUDA backend cannot
  // run here), for the command to tell the user; empty otherwise.
  std::string fallback_reason;
  bool automatic = false;  // resolved from "auto"
};

// Pure: what a device name, in any case (a --device flag or the config's model.device),
// resolves to given `probe`. "cpu"; "cuda" (FailedPrecondition on a build without CUDA or
// on a GPU older than the kernels need, Unavailable when no GPU is visible or the cuBLAS
// libraries do not load); "auto" is cuda when "cuda" would be, else cpu (with the reason
// when a GPU is visible). InvalidArgument
// for anything else. Error messages name the value as typed but not where it came from: the
// caller prefixes the flag or the config key the user set (e.g. "--device: ",
// "model.device: ").
absl::StatusOr<DeviceChoice> ChooseDevice(std::string_view name, const CudaProbe& probe);

// ChooseDevice with this machine's probe: GPUs are counted only for "cuda" and "auto", and
// GPU 0's compute capability read and the cuBLAS libraries loaded (as the CUDA backend
// would) only when one is visible.
absl::StatusOr<DeviceChoice> ResolveDevice(std::string_view name);

// Pure: the device a model of `head_dim` runs on, given `choice`. The choice stands unless
// it is cuda and the CUDA backend has no attention kernel for that head_dim
// (cuda::HasAttentionKernel): then "auto" runs on the CPU, saying why, and "cuda" is
// FailedPrecondition (the caller prefixes the flag or key, as for ChooseDevice).
absl::StatusOr<DeviceChoice> FitDeviceToModel(const DeviceChoice& choice, int head_dim);

// A CpuBackend with `cpu_threads` threads (<= 0: UsableCpus()), or a CudaBackend on GPU 0.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(Device device, int cpu_threads);

// The KV arena dtype the engine uses on `backend`: bf16 on CUDA (half the bytes a decode
// step reads), f32 on the CPU reference backend (what it computes in).
DType DefaultKvDtype(const Backend& backend);

// The kv_cache_config.quantization values the engine runs on `device`: `none` (its native KV
// dtype) and `int8` everywhere, `bf16` by name on CUDA.
absl::Span<const KvQuantization> KvQuantizationsOn(Device device);

// The KV dtype a cache stores for `quantization` on a backend whose native KV dtype is
// `native` (`none` is `native`; the others are their own type).
DType KvDtypeFor(KvQuantization quantization, DType native);

// Records decode steps as CUDA graphs on a CudaBackend (LlamaModel::SetDecodeGraphs); null
// on any other backend, which cannot record. `backend` must outlive the recorder.
std::unique_ptr<OpGraphRecorder> MakeOpGraphRecorder(Backend* backend);

// Writes RandomFillValue(fill, i) as `dtype` (kF32 or kBF16) into element i of the backend
// buffer `data`, i < count: in a kernel on CUDA, through host chunks and CopyToDevice on
// any other backend. Same fill and dtype give the same bytes on every backend. Returns once
// the values are written (CUDA: CudaBackend::FillRandom). REQUIRES: data holds count
// elements of dtype.
absl::Status FillRandom(Backend* backend, void* data, DType dtype, size_t count,
                        const RandomFill& fill);

}  // namespace kvd

#endif  // KVD_TOOLS_DEVICE_H_
