// qpool::cat_gelu on CUDA (Note [Joined GELU op]).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <vector>

#include "quant/cat_gelu_kernels.h"
#include "quant/cat_gelu_op.h"
#include "quant/quant_linear_cuda.h"

namespace qpool::quant {
namespace {

// t as [rows, width] with contiguous rows: a view where its leading dimensions allow one, else a
// copy.
at::Tensor Rows(const at::Tensor& t, int64_t rows) {
  at::Tensor r = t.reshape({rows, t.size(-1)});
  return r.size(1) <= 1 || r.stride(1) == 1 ? r : r.contiguous();
}

at::Tensor CatGeluCuda(const at::Tensor& a, const at::Tensor& b) {
  CheckCatGeluArgs(a, b);
  const c10::cuda::CUDAGuard guard(a.device());
  const int64_t da = a.size(-1), db = b.size(-1);
  std::vector<int64_t> sizes = a.sizes().vec();
  sizes.back() = da + db;
  at::Tensor out = at::empty(sizes, a.options());
  const int64_t rows = da + db == 0 ? 0 : out.numel() / (da + db);
  if (rows == 0) return out;
  const at::Tensor a2 = Rows(a, rows), b2 = Rows(b, rows);
  cuda::LaunchCatGelu(a2.data_ptr(), a2.stride(0), b2.data_ptr(), b2.stride(0), rows, da, db,
                      out.data_ptr(), ElemTypeOf(a.scalar_type()),
                      at::cuda::getCurrentCUDAStream());
  return out;
}

}  // namespace
}  // namespace qpool::quant

TORCH_LIBRARY_IMPL(qpool, CUDA, m) { m.impl("cat_gelu", &qpool::quant::CatGeluCuda); }
