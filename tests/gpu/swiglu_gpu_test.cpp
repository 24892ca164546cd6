// qpool::swiglu on CUDA (Note [SwiGLU op]): the one-pass kernel against the unfused ATen
// operations on the GPU, bit for bit, with and without the row weight, with 16-byte and
// value-wise access, for contiguous inputs and views, and inside a CUDA graph.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <optional>
#include <string>

#include "quant/swiglu_op.h"
#include "testing/cuda_graph_replay.h"

namespace qpool::quant {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "CUDA is not available; GPU test skipped"

at::Tensor Unfused(const at::Tensor& x, const std::optional<at::Tensor>& weight) {
  const int64_t d = x.size(-1) / 2;
  const at::Tensor out = at::silu(x.narrow(-1, 0, d)) * x.narrow(-1, d, d);
  return weight.has_value() ? out * weight->unsqueeze(-1) : out;
}

TEST(SwigluCuda, EqualsTheUnfusedOperations) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(47);
  struct Shape {
    int64_t rows, d, extra;  // x is columns [extra, extra + 2d) of a wider tensor
  };
  // A HiDream routed expert's rows (16-byte access), odd widths (value-wise), and a view
  // starting one value into its rows.
  for (const Shape& sh : {Shape{2048, 6912, 0}, Shape{7, 5, 0}, Shape{9, 16, 1}}) {
    // float64 (a component placed in it) runs the ATen operations themselves.
    for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble}) {
      const at::Tensor wide = at::randn({sh.rows, sh.extra + 2 * sh.d + 3}, at::kCUDA).to(type) * 3;
      const at::Tensor x = wide.narrow(-1, sh.extra, 2 * sh.d);
      const at::Tensor weight = at::rand({sh.rows}, at::kCUDA).to(type);
      for (const std::optional<at::Tensor>& w :
           {std::optional<at::Tensor>(), std::optional(weight)}) {
        const at::Tensor got = Swiglu(x, w);
        const at::Tensor want = Unfused(x, w);
        const std::string what = std::string(c10::toString(type)) + " d=" + std::to_string(sh.d) +
                                 (w.has_value() ? " weighted" : "");
        ASSERT_EQ(got.sizes(), want.sizes()) << what;
        EXPECT_TRUE(at::equal(got, want)) << what << ": max difference "
                                          << (got.to(at::kFloat) - want.to(at::kFloat)).abs().max();
      }
    }
  }
}

TEST(SwigluCuda, CapturesIntoACudaGraph) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(48);
  const at::Tensor x = at::randn({128, 640}, at::kCUDA).to(at::kBFloat16);
  const at::Tensor weight = at::rand({128}, at::kCUDA).to(at::kBFloat16);
  const at::Tensor replayed = testing::ReplayedAfterChange([&] { return Swiglu(x, weight); },
                                                           [&] { x.copy_(at::randn_like(x)); });
  EXPECT_TRUE(at::equal(replayed, Unfused(x, weight)));
}

}  // namespace
}  // namespace qpool::quant
