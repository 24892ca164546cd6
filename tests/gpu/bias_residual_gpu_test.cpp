// qpool::bias_residual on CUDA (Note [Convolution biases]): the one-pass kernel against ATen's two
// additions on the GPU, bit for bit, channels-last and NCHW, with 16-byte and value-wise access,
// the fallbacks, and inside a CUDA graph.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <string>
#include <utility>

#include "quant/bias_residual_op.h"
#include "testing/cuda_graph_replay.h"

namespace qpool::quant {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "CUDA is not available; GPU test skipped"

at::Tensor Unfused(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& residual) {
  return residual + (x + bias.view({1, -1, 1, 1}));
}

TEST(BiasResidualCuda, EqualsTheTwoAtenAdditions) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(47);
  struct Shape {
    int64_t n, c, h, w;
  };
  // An SDXL resnet's output at four images with CFG (16-byte access), odd widths (value-wise),
  // and one pixel.
  for (const Shape& s : {Shape{8, 640, 64, 64}, Shape{3, 5, 7, 9}, Shape{2, 16, 1, 1}}) {
    // float64, and maps in two layouts, run the ATen additions themselves.
    for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble}) {
      for (const auto& [x_format, residual_format] :
           {std::pair{at::MemoryFormat::ChannelsLast, at::MemoryFormat::ChannelsLast},
            std::pair{at::MemoryFormat::Contiguous, at::MemoryFormat::Contiguous},
            std::pair{at::MemoryFormat::ChannelsLast, at::MemoryFormat::Contiguous}}) {
        const auto options = at::TensorOptions().device(at::kCUDA).dtype(type);
        const at::Tensor x = (at::randn({s.n, s.c, s.h, s.w}, options) * 4).contiguous(x_format);
        const at::Tensor bias = at::randn({s.c}, options);
        const at::Tensor residual =
            (at::randn({s.n, s.c, s.h, s.w}, options) * 4).contiguous(residual_format);
        const at::Tensor got = BiasResidual(x, bias, residual);
        const at::Tensor want = Unfused(x, bias, residual);
        const std::string what =
            std::string(c10::toString(type)) + " c=" + std::to_string(s.c) +
            (x_format == at::MemoryFormat::ChannelsLast ? " x NHWC" : " x NCHW") +
            (residual_format == at::MemoryFormat::ChannelsLast ? " residual NHWC"
                                                               : " residual NCHW");
        if (x_format == residual_format) EXPECT_TRUE(got.is_contiguous(x_format)) << what;
        EXPECT_TRUE(at::equal(got, want)) << what << ": max difference "
                                          << (got.to(at::kFloat) - want.to(at::kFloat)).abs().max();
      }
    }
  }
}

TEST(BiasResidualCuda, CapturesIntoACudaGraph) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(48);
  const auto options = at::TensorOptions().device(at::kCUDA).dtype(at::kHalf);
  const at::Tensor x =
      at::randn({2, 320, 32, 32}, options).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor bias = at::randn({320}, options);
  const at::Tensor residual = at::randn_like(x);
  const at::Tensor replayed =
      testing::ReplayedAfterChange([&] { return BiasResidual(x, bias, residual); },
                                   [&] {
                                     x.copy_(at::randn_like(x));
                                     bias.copy_(at::randn_like(bias));
                                   });
  EXPECT_TRUE(at::equal(replayed, Unfused(x, bias, residual)));
}

}  // namespace
}  // namespace qpool::quant
