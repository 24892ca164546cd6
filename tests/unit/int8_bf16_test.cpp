// The exact int8 -> bf16 decode of the tensor-core kernels (Note [Exact int8 to bf16]) on the
// CPU, on every pair of bytes: the kernels' bf16 int8 paths decode each weight with it.
#include "quant/int8_bf16.h"

#include <c10/util/BFloat16.h>
#include <gtest/gtest.h>

#include <cstdint>

namespace qpool::quant::cuda {
namespace {

uint16_t Bf16BitsOf(int value) { return c10::BFloat16(static_cast<float>(value)).x; }

TEST(Int8Bf16, EveryPairOfBytesDecodesExactly) {
  int wrong = 0;
  for (int q0 = -128; q0 <= 127; ++q0) {
    for (int q1 = -128; q1 <= 127; ++q1) {
      // What the kernels' prmt makes of two bytes: 0x43, q1, 0x43, q0 from the high byte down.
      const uint32_t magic_pair = 0x43004300u |
                                  static_cast<uint32_t>(static_cast<uint8_t>(q1)) << 16 |
                                  static_cast<uint8_t>(q0);
      const uint32_t got = Int8PairBf16(magic_pair);
      const uint32_t want = static_cast<uint32_t>(Bf16BitsOf(q1)) << 16 | Bf16BitsOf(q0);
      if (got != want && ++wrong <= 5) {
        ADD_FAILURE() << "q0 " << q0 << " q1 " << q1 << ": got 0x" << std::hex << got << ", want 0x"
                      << want;
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST(Int8Bf16, ExtremesAndZeroKeepTheirSign) {
  // -128 and 127 bound the format; 0 must decode to +0 (bits 0), not -0, so that sums of zero
  // weights are bit-identical to the fp16 path's.
  EXPECT_EQ(Int8PairBf16(0x43804300u), (uint32_t{Bf16BitsOf(-128)} << 16) | 0u);
  EXPECT_EQ(Int8PairBf16(0x437f4301u), (uint32_t{Bf16BitsOf(127)} << 16) | Bf16BitsOf(1));
  EXPECT_EQ(Int8PairBf16(0x43ff43ffu) & 0xffffu, Bf16BitsOf(-1));
}

}  // namespace
}  // namespace qpool::quant::cuda
