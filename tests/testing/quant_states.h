// A linear layer's weight in every format qpool::quant_linear takes, for the tests that compare
// a fused op with its unfused form on each of them.
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "quant/quant_format.h"
#include "quant/quantizer.h"

namespace qpool::testing {

// w [n, k] float32 as none (the float weight, empty state), int8, nf4 (blocksize 64, double
// quantization) and w8a8 with random activation scales in [0.5, 1.5), named by format.
inline std::vector<std::pair<std::string, quant::QuantState>> EveryFormat(const at::Tensor& w) {
  const at::Tensor e = at::empty({0});
  return {{"none", quant::QuantState{w, e, e, e, e, e}},
          {"int8", *quant::QuantizeInt8(w)},
          {"nf4", *quant::QuantizeNf4(w, 64, true)},
          {"w8a8", *quant::QuantizeW8A8(w, at::rand({w.size(1)}) + 0.5)}};
}

}  // namespace qpool::testing
