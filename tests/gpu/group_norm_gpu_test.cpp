// qpool::group_norm on CUDA (Note [Group norm op]): the two-pass kernel against a float64 group
// norm and the unfused ATen operations on the GPU at SD / SDXL resnet blocks' widths, the inputs
// it leaves to the ATen operations, and inside a CUDA graph.
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <optional>
#include <string>

#include "quant/group_norm_op.h"
#include "testing/cuda_graph_replay.h"
#include "testing/group_norm_reference.h"

namespace qpool::quant {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "CUDA is not available; GPU test skipped"

constexpr double kEps = 1e-5;

double MaxAbsDifference(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

struct Bounds {
  double beyond_unfused;  // over 1.5x the unfused ops' error, relative to max |reference|
  double from_unfused;    // from the unfused ops' output, likewise
};

// The unfused ops round the standard deviation, scale and shift to fp16 or bf16; the kernel keeps
// them float32, so the two differ by a few units of the dtype of the output's magnitude.
Bounds BoundsOf(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return {1e-5, 1e-4};
    case at::kHalf:
      return {2e-3, 8e-3};
    default:
      return {1.6e-2, 6e-2};
  }
}

TEST(GroupNormCuda, NearerAFloat64NormThanTheUnfusedOps) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(61);
  struct Shape {
    int64_t n, c, h, w;
  };
  // SDXL's resnet blocks at 4 images with guidance and at a 512x512 image's latents, and two
  // channels per group.
  for (const Shape& sh :
       {Shape{8, 320, 64, 64}, Shape{2, 640, 32, 32}, Shape{2, 1280, 16, 16}, Shape{2, 64, 8, 8}}) {
    for (at::ScalarType type : {at::kHalf, at::kBFloat16, at::kFloat}) {
      // A nonzero mean in each group, as a resnet block's activations have.
      const at::Tensor x = (at::randn({sh.n, sh.c, sh.h, sh.w}, at::kCUDA) * 3 + 1)
                               .to(type)
                               .contiguous(at::MemoryFormat::ChannelsLast);
      const at::Tensor weight = at::randn({sh.c}, at::kCUDA).to(type);
      const at::Tensor bias = at::randn({sh.c}, at::kCUDA).to(type);
      const at::Tensor temb = (at::randn({sh.n, sh.c}, at::kCUDA) * 2).to(type);
      const Bounds bounds = BoundsOf(type);
      for (bool with_add : {false, true}) {
        const std::optional<at::Tensor> add = with_add ? std::optional(temb) : std::nullopt;
        for (bool silu : {false, true}) {
          const std::string what = std::string(c10::toString(type)) + " " + c10::str(x.sizes()) +
                                   (with_add ? " add" : "") + (silu ? " silu" : "");
          const at::Tensor got = GroupNorm(x, weight, bias, 32, kEps, add, silu);
          ASSERT_EQ(got.sizes(), x.sizes()) << what;
          EXPECT_EQ(got.scalar_type(), type) << what;
          EXPECT_TRUE(got.is_contiguous(at::MemoryFormat::ChannelsLast))
              << what << ": strides " << got.strides();
          const at::Tensor unfused = GroupNormCpu(x, weight, bias, 32, kEps, add, silu);
          const at::Tensor ref = testing::GroupNormFloat64(x, weight, bias, 32, kEps, add, silu);
          const double scale = ref.abs().max().item<double>();
          const double error = MaxAbsDifference(got, ref);
          const double unfused_error = MaxAbsDifference(unfused, ref);
          EXPECT_LE(error, unfused_error * 1.5 + bounds.beyond_unfused * scale)
              << what << ": unfused ops' error " << unfused_error << ", max |reference| " << scale;
          EXPECT_LE(MaxAbsDifference(got, unfused), bounds.from_unfused * scale)
              << what << ": max |reference| " << scale;
        }
      }
    }
  }
}

TEST(GroupNormCuda, FallsBackWhereTheKernelDoesNotApply) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(62);
  struct Input {
    const char* what;
    at::Tensor x;
    int64_t groups;
  };
  const at::Tensor half = at::randn({2, 320, 16, 16}, at::kCUDA).to(at::kHalf) * 3 + 1;
  const at::Tensor wide = at::randn({2, 64, 8, 8}, at::kCUDA).to(at::kDouble) * 3 + 1;
  const at::Tensor odd = at::randn({2, 36, 8, 8}, at::kCUDA).to(at::kHalf) * 3 + 1;
  for (const Input& in :
       {Input{"NCHW-contiguous", half, 32},
        Input{"float64", wide.contiguous(at::MemoryFormat::ChannelsLast), 32},
        Input{"36 channels", odd.contiguous(at::MemoryFormat::ChannelsLast), 4}}) {
    const int64_t c = in.x.size(1);
    const at::TensorOptions options = in.x.options();
    const at::Tensor weight = at::randn({c}, options), bias = at::randn({c}, options);
    const at::Tensor add = at::randn({in.x.size(0), c}, options);
    for (bool silu : {false, true}) {
      const at::Tensor got = GroupNorm(in.x, weight, bias, in.groups, kEps, add, silu);
      const at::Tensor want = GroupNormCpu(in.x, weight, bias, in.groups, kEps, add, silu);
      EXPECT_TRUE(at::equal(got, want))
          << in.what << (silu ? " silu" : "") << ": max difference " << MaxAbsDifference(got, want);
      EXPECT_TRUE(got.is_contiguous(in.x.suggest_memory_format())) << in.what;
    }
  }
}

TEST(GroupNormCuda, CapturesIntoACudaGraph) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(63);
  const at::TensorOptions half = at::TensorOptions().device(at::kCUDA).dtype(at::kHalf);
  const at::Tensor x =
      (at::randn({2, 320, 32, 32}, half) * 3 + 1).contiguous(at::MemoryFormat::ChannelsLast);
  const at::Tensor weight = at::randn({320}, half), bias = at::randn({320}, half);
  const at::Tensor add = at::randn({2, 320}, half);
  const at::Tensor replayed =
      testing::ReplayedAfterChange([&] { return GroupNorm(x, weight, bias, 32, kEps, add, true); },
                                   [&] {
                                     x.copy_(at::randn_like(x) * 2 - 1);
                                     add.copy_(at::randn_like(add));
                                   });
  EXPECT_TRUE(at::equal(replayed, GroupNorm(x, weight, bias, 32, kEps, add, true)));
}

}  // namespace
}  // namespace qpool::quant
