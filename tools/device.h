#ifndef KVD_TOOLS_DEVICE_H_
#define KVD_TOOLS_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
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

// True when this binary was built with the CUDA backend.
bool BuiltWithCuda();

// Resolves a device name, in any case (a --device flag or the config's model.device): "cpu"; "cuda"
// (FailedPrecondition on a build without CUDA, Unavailable when no GPU is visible); "auto"
// is cuda when the build has CUDA and CudaDeviceCount() > 0, else cpu. InvalidArgument for
// anything else. Error messages name the value as typed but not where it came from: the caller
// prefixes the flag or the config key the user set (e.g. "--device: ", "model.device: ").
absl::StatusOr<Device> ResolveDevice(std::string_view name);

// A CpuBackend with `cpu_threads` threads (<= 0: UsableCpus()), or a CudaBackend on GPU 0.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(Device device, int cpu_threads);

// The KV arena dtype the engine uses on `backend`: bf16 on CUDA (half the bytes a decode
// step reads), f32 on the CPU reference backend (what it computes in).
DType DefaultKvDtype(const Backend& backend);

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
