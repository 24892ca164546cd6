// qpool::ada_norm on CUDA (Note [Modulated norm op]): the one-pass kernel against the unfused ATen
// operations on the GPU, with 16-byte and value-wise access, for views, rows too wide for the
// kernel (the ATen operations), and inside a CUDA graph.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <string>

#include "quant/ada_norm_op.h"
#include "testing/cuda_graph_replay.h"
#include "testing/op_schemas.h"

namespace qpool::quant {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "CUDA is not available; GPU test skipped"

using testing::ExpectCloseToTheUnfusedOps;

TEST(AdaNormCuda, EqualsTheUnfusedOperations) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(51);
  struct Shape {
    int64_t b, n, d;
  };
  // FLUX's width (16-byte access), an odd width (value-wise), one value past the value-wise
  // registers (the ATen operations) and two batches.
  for (const Shape& sh :
       {Shape{1, 4096, 3072}, Shape{2, 7, 13}, Shape{1, 3, 1025}, Shape{2, 33, 256}}) {
    for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16}) {
      const at::Tensor x = (at::randn({sh.b, sh.n, sh.d}, at::kCUDA) * 4 + 1).to(type);
      const at::Tensor mod = at::randn({sh.b, 6 * sh.d}, at::kCUDA).to(type);
      const at::Tensor shift = mod.narrow(1, 0, sh.d), scale = mod.narrow(1, sh.d, sh.d);
      const std::string what = std::string(c10::toString(type)) + " d " + std::to_string(sh.d);
      ExpectCloseToTheUnfusedOps(AdaNorm(x, shift, scale, 1e-6), AdaNormCpu(x, shift, scale, 1e-6),
                                 what);
      // x as a token slice of a wider sequence, as FLUX's output norm reads the image tokens.
      const at::Tensor joined = (at::randn({sh.b, sh.n + 3, sh.d}, at::kCUDA) * 2).to(type);
      const at::Tensor image = joined.narrow(1, 3, sh.n);
      ExpectCloseToTheUnfusedOps(AdaNorm(image, shift, scale, 1e-6),
                                 AdaNormCpu(image, shift, scale, 1e-6), what + " (token slice)");
    }
  }
}

TEST(AdaNormCuda, CapturesIntoACudaGraph) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(52);
  const at::Tensor x = at::randn({1, 64, 3072}, at::kCUDA).to(at::kBFloat16);
  const at::Tensor shift = at::randn({1, 3072}, at::kCUDA).to(at::kBFloat16);
  const at::Tensor scale = at::randn({1, 3072}, at::kCUDA).to(at::kBFloat16);
  const at::Tensor replayed = testing::ReplayedAfterChange(
      [&] { return AdaNorm(x, shift, scale, 1e-6); }, [&] { x.copy_(at::randn_like(x)); });
  EXPECT_TRUE(at::equal(replayed, AdaNorm(x, shift, scale, 1e-6)));
}

}  // namespace
}  // namespace qpool::quant
