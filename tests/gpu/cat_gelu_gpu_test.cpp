// qpool::cat_gelu on CUDA (Note [Joined GELU op]): the one-pass kernel against the unfused ATen
// operations on the GPU, with 16-byte and value-wise access, for views of a fused projection's
// output, and inside a CUDA graph.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <string>

#include "quant/cat_gelu_op.h"
#include "testing/cuda_graph_replay.h"

namespace qpool::quant {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "CUDA is not available; GPU test skipped"

// The kernel's tanhf and ATen's may round a GELU one unit of the dtype apart; the joined copy of
// a is exact.
void ExpectJoined(const at::Tensor& got, const at::Tensor& a, const at::Tensor& b,
                  const std::string& what) {
  const int64_t da = a.size(-1);
  ASSERT_EQ(got.size(-1), da + b.size(-1)) << what;
  EXPECT_TRUE(at::equal(got.narrow(-1, 0, da), a)) << what;
  const at::Tensor want = at::gelu(b, "tanh").to(at::kFloat);
  const at::Tensor diff = (got.narrow(-1, da, b.size(-1)).to(at::kFloat) - want).abs();
  const double tol = got.scalar_type() == at::kFloat  ? 1e-6
                     : got.scalar_type() == at::kHalf ? 1e-3
                                                      : 8e-3;
  EXPECT_TRUE(diff.le(want.abs() * tol + tol).all().item<bool>())
      << what << ": max difference " << diff.max().item<float>();
}

TEST(CatGeluCuda, EqualsTheUnfusedOperations) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(41);
  struct Shape {
    int64_t rows, da, db, extra;  // b is columns [extra, extra + db) of a wider output
  };
  // FLUX's single-stream block (16-byte access on a view), odd widths (value-wise), and a view
  // starting one value into its rows.
  for (const Shape& sh :
       {Shape{4608, 3072, 12288, 9216}, Shape{7, 5, 11, 0}, Shape{9, 16, 24, 1}}) {
    for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16}) {
      const at::Tensor a = at::randn({1, sh.rows, sh.da}, at::kCUDA).to(type) * 3;
      const at::Tensor wide = at::randn({1, sh.rows, sh.extra + sh.db}, at::kCUDA).to(type) * 3;
      const at::Tensor b = wide.narrow(-1, sh.extra, sh.db);
      const std::string what = std::string(c10::toString(type)) + " " + std::to_string(sh.da) +
                               "+" + std::to_string(sh.db);
      ExpectJoined(CatGelu(a, b), a, b, what);
    }
  }
}

TEST(CatGeluCuda, CapturesIntoACudaGraph) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(42);
  const at::Tensor a = at::randn({1, 64, 128}, at::kCUDA).to(at::kBFloat16);
  const at::Tensor b = at::randn({1, 64, 512}, at::kCUDA).to(at::kBFloat16);
  const at::Tensor replayed = testing::ReplayedAfterChange([&] { return CatGelu(a, b); },
                                                           [&] { b.copy_(at::randn_like(b)); });
  EXPECT_TRUE(at::equal(replayed, CatGelu(a, b)));
}

}  // namespace
}  // namespace qpool::quant
