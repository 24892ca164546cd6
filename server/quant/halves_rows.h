// The host side shared by the ops whose CUDA kernel joins the two halves of x's rows
// (halves_kernel.cuh: qpool::geglu, qpool::swiglu).
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace qpool::quant {

struct HalvesRows {
  at::Tensor out;  // x's shape with its last dimension halved, contiguous
  at::Tensor x2;   // x as [rows, 2d] with contiguous rows (a view where x's layout allows one)
  int64_t rows = 0, d = 0;
};

// The output and x's rows for x [..., 2d]; rows is 0 where there is nothing to compute.
inline HalvesRows PrepareHalves(const at::Tensor& x) {
  HalvesRows h;
  h.d = x.size(-1) / 2;
  std::vector<int64_t> sizes = x.sizes().vec();
  sizes.back() = h.d;
  h.out = at::empty(sizes, x.options());
  h.rows = h.d == 0 ? 0 : h.out.numel() / h.d;
  if (h.rows == 0) return h;
  h.x2 = x.reshape({h.rows, 2 * h.d});
  if (h.x2.stride(1) != 1) h.x2 = h.x2.contiguous();
  return h;
}

}  // namespace qpool::quant
