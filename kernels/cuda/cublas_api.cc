#include "kernels/cuda/cublas_api.h"

#include <dlfcn.h>

#include <atomic>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

#ifndef KVD_CUDA_LIBRARY_DIR
#define KVD_CUDA_LIBRARY_DIR ""
#endif

namespace kvd {
namespace {

// The symbol of a function name after macro expansion: cublasCreate -> "cublasCreate_v2".
#define KVD_CUBLAS_SYMBOL_OF(function) #function
#define KVD_CUBLAS_SYMBOL(function) KVD_CUBLAS_SYMBOL_OF(function)

std::atomic<const CublasApi*> loaded{nullptr};

// dlopen of `name` as the dynamic linker would look for it, then in the build's CUDA
// library folder; nullptr with `error` set when neither opens.
void* Open(absl::string_view name, std::string& error) {
  const std::string soname(name);
  if (void* handle = ::dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL); handle != nullptr) {
    return handle;
  }
  const char* first = ::dlerror();
  error = first != nullptr ? first : soname;
  const std::string dir = KVD_CUDA_LIBRARY_DIR;
  if (!dir.empty() && soname.find('/') == std::string::npos) {
    const std::string path = absl::StrCat(dir, "/", soname);
    if (void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL); handle != nullptr) {
      return handle;
    }
    const char* second = ::dlerror();
    absl::StrAppend(&error, "; ", second != nullptr ? second : path);
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<CublasApi> OpenCublas(absl::string_view lt_library, absl::string_view blas_library) {
  const auto cannot_load = [](absl::string_view name, absl::string_view why) {
    return absl::UnavailableError(absl::StrCat(
        "cannot load cuBLAS (", name, ") for the CUDA device: ", why, ". The CUDA device needs ",
        "the CUDA ", CUBLAS_VER_MAJOR, " cuBLAS libraries: install them, or add their folder ",
        "to LD_LIBRARY_PATH; --device cpu runs without them"));
  };
  std::string error;
  void* const lt = Open(lt_library, error);  // first: libcublas needs it
  if (lt == nullptr) return cannot_load(lt_library, error);
  void* const blas = Open(blas_library, error);
  if (blas == nullptr) {
    ::dlclose(lt);
    return cannot_load(blas_library, error);
  }
  CublasApi api;
  absl::Status status;
  const auto bind = [&](void* library, absl::string_view library_name, const char* symbol,
                        auto& function) {
    if (!status.ok()) return;
    ::dlerror();
    void* const address = ::dlsym(library, symbol);
    if (address == nullptr) {
      status = cannot_load(library_name, absl::StrCat("it has no function ", symbol));
      return;
    }
    function = reinterpret_cast<std::remove_reference_t<decltype(function)>>(address);
  };
#define KVD_CUBLAS_BIND(library, function) \
  bind(library, library##_library, KVD_CUBLAS_SYMBOL(function), api.function);
  KVD_CUBLAS_FUNCTIONS(KVD_CUBLAS_BIND)
#undef KVD_CUBLAS_BIND
  bind(blas, blas_library, "cublasGemmEx", api.cublasGemmEx);
  if (!status.ok()) {
    ::dlclose(blas);
    ::dlclose(lt);
    return status;
  }
  return api;  // the libraries stay open: the table points into them
}

absl::StatusOr<const CublasApi*> LoadCublas() {
  static const absl::StatusOr<CublasApi>* const api = [] {
    auto* opened =
        new absl::StatusOr<CublasApi>(OpenCublas(absl::StrCat("libcublasLt.so.", CUBLAS_VER_MAJOR),
                                                 absl::StrCat("libcublas.so.", CUBLAS_VER_MAJOR)));
    if (opened->ok()) loaded.store(&**opened, std::memory_order_release);
    return opened;
  }();
  if (!api->ok()) return api->status();
  return &**api;
}

const CublasApi* LoadedCublas() { return loaded.load(std::memory_order_acquire); }

}  // namespace kvd
