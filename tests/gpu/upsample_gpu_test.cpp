// qpool::upsample_nearest on CUDA (Note [Upsample op]): the vectorized doubling against ATen's
// nearest upsampling on the GPU, bit for bit, in every dtype and layout, the fallbacks (NCHW,
// odd channel rows, other sizes, float64), and inside a CUDA graph.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <string>

#include "quant/upsample_op.h"
#include "testing/cuda_graph_replay.h"

namespace qpool::quant {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "CUDA is not available; GPU test skipped"

TEST(UpsampleCuda, EqualsAtensNearestUpsampling) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(61);
  struct Shape {
    int64_t n, c, h, w;
  };
  // SDXL's UNet upsamplers at two rows (16-byte packs), a VAE's at float32, odd channel rows
  // (ATen's kernel), one pixel.
  for (const Shape& s :
       {Shape{2, 1280, 32, 32}, Shape{1, 256, 65, 33}, Shape{3, 5, 7, 9}, Shape{2, 16, 1, 1}}) {
    for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16, at::kDouble}) {
      for (at::MemoryFormat format :
           {at::MemoryFormat::ChannelsLast, at::MemoryFormat::Contiguous}) {
        const auto options = at::TensorOptions().device(at::kCUDA).dtype(type);
        const at::Tensor x = at::randn({s.n, s.c, s.h, s.w}, options).contiguous(format);
        const at::Tensor got = UpsampleNearest(x, std::nullopt);
        const at::Tensor want = at::upsample_nearest2d(x, {2 * s.h, 2 * s.w});
        const std::string what = std::string(c10::toString(type)) + " " + std::to_string(s.c) +
                                 "x" + std::to_string(s.h) + "x" + std::to_string(s.w) +
                                 (format == at::MemoryFormat::ChannelsLast ? " NHWC" : " NCHW");
        // ATen's layout (x's, except where a map of one pixel fits both).
        EXPECT_EQ(got.strides(), want.strides()) << what;
        if (s.h > 1) EXPECT_TRUE(got.is_contiguous(format)) << what;
        EXPECT_TRUE(at::equal(got, want)) << what;
      }
    }
  }
  // To a skip connection's size that is not twice x's.
  const at::Tensor x = at::randn({2, 320, 5, 7}, at::TensorOptions().device(at::kCUDA))
                           .to(at::kHalf)
                           .contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor like = at::empty({2, 640, 9, 13}, x.options());
  EXPECT_TRUE(at::equal(UpsampleNearest(x, like), at::upsample_nearest2d(x, {9, 13})));
}

TEST(UpsampleCuda, CapturesIntoACudaGraph) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(62);
  const auto options = at::TensorOptions().device(at::kCUDA).dtype(at::kHalf);
  const at::Tensor x =
      at::randn({2, 640, 16, 16}, options).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor replayed = testing::ReplayedAfterChange(
      [&] { return UpsampleNearest(x, std::nullopt); }, [&] { x.copy_(at::randn_like(x)); });
  EXPECT_TRUE(at::equal(replayed, at::upsample_nearest2d(x, {32, 32})));
}

}  // namespace
}  // namespace qpool::quant
