// qpool::geglu on CUDA (Note [GEGLU op]): the one-pass kernel against the unfused ATen operations
// on the GPU, bit for bit, with 16-byte and value-wise access, for contiguous inputs and views,
// and inside a CUDA graph.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <string>

#include "quant/geglu_op.h"
#include "testing/cuda_graph_replay.h"

namespace qpool::quant {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "CUDA is not available; GPU test skipped"

at::Tensor Unfused(const at::Tensor& x) {
  const int64_t d = x.size(-1) / 2;
  return x.narrow(-1, 0, d) * at::gelu(x.narrow(-1, d, d));
}

TEST(GegluCuda, EqualsTheUnfusedOperations) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(43);
  struct Shape {
    int64_t batch, rows, d, extra;  // x is columns [extra, extra + 2d) of a wider tensor
  };
  // An SDXL block's feed-forward at 1024 tokens (16-byte access), odd widths (value-wise), and
  // a view starting one value into its rows.
  for (const Shape& sh : {Shape{2, 1024, 5120, 0}, Shape{3, 7, 5, 0}, Shape{2, 9, 16, 1}}) {
    // float64 (a component placed in it) runs the ATen operations themselves.
    for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble}) {
      const at::Tensor wide =
          at::randn({sh.batch, sh.rows, sh.extra + 2 * sh.d + 3}, at::kCUDA).to(type) * 3;
      const at::Tensor x = wide.narrow(-1, sh.extra, 2 * sh.d);
      const at::Tensor got = Geglu(x);
      const at::Tensor want = Unfused(x);
      const std::string what = std::string(c10::toString(type)) + " d=" + std::to_string(sh.d);
      ASSERT_EQ(got.sizes(), want.sizes()) << what;
      EXPECT_TRUE(at::equal(got, want))
          << what << ": max difference " << (got.to(at::kFloat) - want.to(at::kFloat)).abs().max();
    }
  }
}

TEST(GegluCuda, CapturesIntoACudaGraph) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(44);
  const at::Tensor x = at::randn({2, 64, 640}, at::kCUDA).to(at::kHalf);
  const at::Tensor replayed =
      testing::ReplayedAfterChange([&] { return Geglu(x); }, [&] { x.copy_(at::randn_like(x)); });
  EXPECT_TRUE(at::equal(replayed, Unfused(x)));
}

}  // namespace
}  // namespace qpool::quant
