// Device helpers of the kernels that quantize w8a8 rows (Note [Fused W8A8 kernels] in
// w8a8_kernels.cu): the row's divisor and its int8 values, shared by the quantizing kernels and
// the producers that quantize the rows they compute (Note [Quantized norm rows] in
// layer_norm_kernels.cu). Included by .cu files only.
#pragma once

#include <cstdint>
#include <type_traits>

#include "quant/quant_kernel_common.cuh"

namespace qpool::quant::cuda {
namespace {

// A row's divisor d (its maximum, or 1 where that is 0) and its reciprocal (Note [Division by
// the row's reciprocal] in w8a8_kernels.cu).
struct RowDivisor {
  float d, y;
  // Whether Quantize<true> divides exactly (else Quantize<false> must).
  __device__ bool ByReciprocal() const { return d >= 0x1p-60f && d <= 0x1p100f; }
  // RN(xs / d): by the reciprocal, or by an IEEE division.
  template <bool kByReciprocal>
  __device__ __forceinline__ float Divide(float xs) const {
    if constexpr (kByReciprocal) {
      float q = __fmul_rn(xs, y);
      q = __fmaf_rn(__fmaf_rn(-d, q, xs), y, q);
      return __fmaf_rn(__fmaf_rn(-d, q, xs), y, q);
    } else {
      return __fdiv_rn(xs, d);
    }
  }
  // The quantized value of x / smooth (`xs`), as the low byte of the result.
  template <bool kByReciprocal>
  __device__ __forceinline__ uint32_t Quantize(float xs) const {
    const float v = fminf(fmaxf(__fmul_rn(Divide<kByReciprocal>(xs), 127.f), -127.f), 127.f);
    return __float_as_uint(__fadd_rn(v, 0x1.8p23f)) & 0xffu;
  }
  // Eight quantized values as two words, the first value in the lowest byte.
  template <bool kByReciprocal>
  __device__ __forceinline__ uint2 Quantize8(const float (&xs)[8]) const {
    uint32_t w[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 8; ++j) w[j / 4] |= Quantize<kByReciprocal>(xs[j]) << (8 * (j % 4));
    return make_uint2(w[0], w[1]);
  }
};

__device__ __forceinline__ RowDivisor DivisorOf(float row_max) {
  const float d = row_max == 0.f ? 1.f : row_max;
  return RowDivisor{d, __frcp_rn(d)};
}

// Calls f(std::true_type{}) for a row that Quantize<true> divides, f(std::false_type{}) else: a
// branch per row, around the whole loop, so no thread computes both.
template <typename F>
__device__ __forceinline__ void WithDivision(const RowDivisor& div, F&& f) {
  if (div.ByReciprocal()) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

// Writes a row's maximum and, when asked for, its scale on the product, max / 127.
__device__ __forceinline__ void StoreRowMax(float m, int64_t row, float* row_amax,
                                            float* row_scale) {
  row_amax[row] = m;
  if (row_scale != nullptr) row_scale[row] = __fdiv_rn(m, 127.f);
}

// xs[0 .. 7] divided by smooth[i .. i + 7] (two 16-byte loads of smooth; Note [Unit scales] in
// w8a8_kernels.cu: a chunk whose eight scales are all 1 skips its divisions).
__device__ __forceinline__ void DivideBySmooth8(const float* smooth, int64_t i, float (&xs)[8]) {
  const float4 s0 = *reinterpret_cast<const float4*>(smooth + i);
  const float4 s1 = *reinterpret_cast<const float4*>(smooth + i + 4);
  const float sv[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
  bool unit = true;
#pragma unroll
  for (int j = 0; j < 8; ++j) unit &= sv[j] == 1.f;
  if (!unit) {
#pragma unroll
    for (int j = 0; j < 8; ++j) xs[j] = __fdiv_rn(xs[j], sv[j]);
  }
}

}  // namespace
}  // namespace qpool::quant::cuda
