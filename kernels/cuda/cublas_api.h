#ifndef KVD_KERNELS_CUDA_CUBLAS_API_H_
#define KVD_KERNELS_CUDA_CUBLAS_API_H_

#include <cublasLt.h>
#include <cublas_v2.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvd {

// kvd does not link cuBLAS: it loads libcublasLt and libcublas when the first CUDA backend
// is made. Loading libcublasLt runs its static initialisers, about half a second of CPU,
// which `kvd --help`, `kvd client`, a daemon on the CPU device and every test process
// would otherwise pay at startup; and a binary built with CUDA runs where the cuBLAS
// libraries are missing for as long as it does not use the GPU.
//
// The entry points kvd calls, as (library, function). A member of CublasApi has the
// function's name, so a call reads api.cublasLtMatmul(...); cublas_v2.h's macros
// (cublasCreate -> cublasCreate_v2) apply to the member as they would to the function.
#define KVD_CUBLAS_FUNCTIONS(X)               \
  X(lt, cublasLtGetVersion)                   \
  X(lt, cublasLtCreate)                       \
  X(lt, cublasLtDestroy)                      \
  X(lt, cublasLtMatmulDescCreate)             \
  X(lt, cublasLtMatmulDescDestroy)            \
  X(lt, cublasLtMatmulDescSetAttribute)       \
  X(lt, cublasLtMatrixLayoutCreate)           \
  X(lt, cublasLtMatrixLayoutDestroy)          \
  X(lt, cublasLtMatmulPreferenceCreate)       \
  X(lt, cublasLtMatmulPreferenceDestroy)      \
  X(lt, cublasLtMatmulPreferenceSetAttribute) \
  X(lt, cublasLtMatmulAlgoGetHeuristic)       \
  X(lt, cublasLtMatmul)                       \
  X(blas, cublasCreate)                       \
  X(blas, cublasDestroy)                      \
  X(blas, cublasSetStream)                    \
  X(blas, cublasGetStatusName)                \
  X(blas, cublasGetStatusString)

struct CublasApi {
#define KVD_CUBLAS_MEMBER(library, function) decltype(&::function) function = nullptr;
  KVD_CUBLAS_FUNCTIONS(KVD_CUBLAS_MEMBER)
#undef KVD_CUBLAS_MEMBER
  // Not in the list: C++ sees two cublasGemmEx, the library's and an inline wrapper that
  // takes a cudaDataType compute type. This is the library's (libcublas).
  cublasStatus_t (*cublasGemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                 int, const void*, const void*, cudaDataType, int, const void*,
                                 cudaDataType, int, const void*, void*, cudaDataType, int,
                                 cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
};

// The cuBLAS libraries of the major version kvd was built against (libcublasLt.so.N and
// libcublas.so.N), loaded on the first call; every call returns the same table, or the same
// error: Unavailable, naming the library and what to install or set (LD_LIBRARY_PATH).
// They are looked for as the dynamic linker would (LD_LIBRARY_PATH, ldconfig's cache), then
// in the CUDA toolkit's library folder of the build. Thread safe; never unloaded.
absl::StatusOr<const CublasApi*> LoadCublas();

// The table if LoadCublas has succeeded, else nullptr. Thread safe.
const CublasApi* LoadedCublas();

// Opens the two libraries by these names (looked for as LoadCublas does) and binds every
// entry point; for LoadCublas and for tests. Each call opens them again (dlopen counts).
absl::StatusOr<CublasApi> OpenCublas(absl::string_view lt_library, absl::string_view blas_library);

}  // namespace kvd

#endif  // KVD_KERNELS_CUDA_CUBLAS_API_H_
