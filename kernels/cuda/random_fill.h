#ifndef KVD_KERNELS_CUDA_RANDOM_FILL_H_
#define KVD_KERNELS_CUDA_RANDOM_FILL_H_

// Counter-based pseudo-random values for synthetic weights and KV contents, computable
// element by element on the host and on the device with bit-identical results: element i
// of a tensor is a pure function of (key, i), so a 16 GB model can be filled in place on
// the GPU and any element checked on the host. No CUDA headers: host code of a CPU-only
// build includes this too.

#include <cstdint>

#if defined(__CUDACC__)
#define KVD_HOST_DEVICE __host__ __device__
#else
#define KVD_HOST_DEVICE
#endif

namespace kvd {

// value[i] = offset + scale * u(key, i), with u uniform on [-1, 1) in steps of 2^-23.
// Plain aggregate.
struct RandomFill {
  uint64_t key = 0;  // RandomFillKey(seed, tensor)
  float scale = 1.0f;
  float offset = 0.0f;
};

// SplitMix64's finalizer: a bijection on 64 bits with full avalanche.
KVD_HOST_DEVICE inline uint64_t MixBits64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The stream key of tensor `tensor` under `seed`; distinct tensors get unrelated streams.
KVD_HOST_DEVICE inline uint64_t RandomFillKey(uint64_t seed, uint64_t tensor) {
  return MixBits64(MixBits64(seed + 0x9E3779B97F4A7C15ull) ^ (tensor * 0xD1B54A32D192ED03ull));
}

// Element i of the fill. The product and the sum are each rounded to fp32 on both sides
// (never fused), so host and device agree bit for bit.
KVD_HOST_DEVICE inline float RandomFillValue(const RandomFill& f, uint64_t i) {
  const uint64_t h = MixBits64(f.key + (i + 1) * 0x9E3779B97F4A7C15ull);
  const float u = static_cast<float>(static_cast<int32_t>(h >> 40) - (1 << 23)) *
                  (1.0f / static_cast<float>(1 << 23));
#if defined(__CUDA_ARCH__)
  return __fadd_rn(f.offset, __fmul_rn(u, f.scale));  // no FMA contraction
#else
  // volatile: GCC contracts across statements by default (-ffp-contract=fast) where the target
  // has FMA (aarch64 hosts, x86 with -march=haswell and up); the store rounds the product.
  const volatile float scaled = u * f.scale;
  return f.offset + scaled;
#endif
}

}  // namespace kvd

#endif  // KVD_KERNELS_CUDA_RANDOM_FILL_H_
