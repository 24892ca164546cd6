// Exact int8 -> bf16 decode of the tensor-core quant_linear kernels (quant_mma_common.cuh), for
// the host too, so that the CPU tests check it on every byte (tests/unit/int8_bf16_test.cpp).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace qpool::quant::cuda {

// Note [Exact int8 to bf16]
// bf16 keeps 8 significant bits, so the fp16 path's trick (one magic exponent over all 256 byte
// values) cannot hold an int8 exactly. Split the byte q instead: its low 7 bits l under the magic
// byte 0x43 make the bf16 A = 128 + l (exponent 2^7, ulp 1), and its sign bit s under the same
// byte makes C = 0x4300 | s << 7, the bf16 128 (s = 0) or 256 (s = 1). A - C = l - 128 s = q
// exactly (operands and result are representable). One prmt puts two bytes under the magic byte
// (`magic_pair` = 0x43, q1, 0x43, q0 from the high byte down), two and's keep A's and C's bits,
// one bf16x2 subtraction decodes the pair: 4 instructions per pair, where widening through f32
// took 5.5 (a prmt and a float subtraction per value, a pack per pair, and the 0x80 flip per
// word that both magic-number tricks on the whole byte need).
__host__ __device__ __forceinline__ uint32_t Int8PairBf16(uint32_t magic_pair) {
  const uint32_t a = magic_pair & 0xff7fff7fu;  // 128 + l
  const uint32_t c = magic_pair & 0xff80ff80u;  // 128 or 256
  const __nv_bfloat162 r = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&a),
                                   *reinterpret_cast<const __nv_bfloat162*>(&c));
  return *reinterpret_cast<const uint32_t*>(&r);
}

}  // namespace qpool::quant::cuda
