#ifndef KVD_KERNELS_KV_QUANT_H_
#define KVD_KERNELS_KV_QUANT_H_

// KV quantization arithmetic, one definition for every backend (host code and CUDA device
// code include it alike), so that a row stored by one backend reads back the same in all.
//
// int8 (cache/kv_layout.h): one KV row (a token's head, head_dim values) shares one fp32
// scale, symmetric around 0:
//   scale = max|x| / 127,  q[i] = x[i] / scale rounded to nearest (ties to even), in
//   [-127, 127];  value = q[i] * scale.
// A value's error is at most scale / 2 (= max|x| / 254), plus fp32 rounding. An all-zero
// row stores scale 0. A row with an infinity or NaN stores scale NaN and q = 0, so every
// value of it reads back NaN: a non-finite K or V stays visible downstream, as it would in
// an fp32 cache, instead of turning into finite numbers.

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define KVD_KV_QUANT_FN __host__ __device__ __forceinline__
#else
#define KVD_KV_QUANT_FN inline
#endif

namespace kvd {

inline constexpr float kInt8KvMax = 127.0f;

// max|x| over n values; NaN if any value is NaN (a plain fmax would skip it).
KVD_KV_QUANT_FN float MaxAbs(const float* x, int n) {
  float m = 0.0f;
  for (int i = 0; i < n; ++i) {
    const float a = fabsf(x[i]);
    if (a > m || a != a) m = a;  // a NaN is taken, and then kept: nothing compares above it
  }
  return m;
}

// The scale of a row whose largest magnitude is max_abs: NaN for a non-finite row.
KVD_KV_QUANT_FN float Int8KvScale(float max_abs) {
  return max_abs <= 3.4028234663852886e38f ? max_abs / kInt8KvMax : NAN;
}

// One value of a row with scale `scale` (Int8KvScale). REQUIRES: |x| <= 127 * scale, as for
// every value of the row the scale came from.
KVD_KV_QUANT_FN int8_t QuantizeInt8Kv(float x, float scale) {
  if (!(scale > 0.0f)) return 0;  // an all-zero or non-finite row
  const float q = rintf(x / scale);
  return static_cast<int8_t>(q > kInt8KvMax ? kInt8KvMax : (q < -kInt8KvMax ? -kInt8KvMax : q));
}

KVD_KV_QUANT_FN float DequantizeInt8Kv(int8_t q, float scale) {
  return static_cast<float>(q) * scale;
}

// Quantizes n values into q and returns their scale.
KVD_KV_QUANT_FN float QuantizeInt8KvRow(const float* x, int n, int8_t* q) {
  const float scale = Int8KvScale(MaxAbs(x, n));
  for (int i = 0; i < n; ++i) q[i] = QuantizeInt8Kv(x[i], scale);
  return scale;
}

}  // namespace kvd

#endif  // KVD_KERNELS_KV_QUANT_H_
