// --attention (Note [Attention backend]): the priority order each name gives, refused names, and
// the order the process keeps once applied.
#include "component/attention_backend.h"

#include <ATen/Context.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

namespace qpool {
namespace {

// ATen's backend numbers (at::SDPBackend).
constexpr int64_t kMath = 0, kFlash = 1, kEfficient = 2, kCudnn = 3, kOverrideable = 4;
// PyTorch's own order.
const std::vector<int64_t> kPyTorch = {kFlash, kEfficient, kMath, kCudnn, kOverrideable};

TEST(AttentionBackend, TheNamedBackendGoesFirstAndTheRestKeepTheirOrder) {
  EXPECT_EQ(*AttentionPriority("auto", kPyTorch), kPyTorch);
  EXPECT_EQ(*AttentionPriority("flash", kPyTorch), kPyTorch);
  EXPECT_EQ(*AttentionPriority("cudnn", kPyTorch),
            (std::vector<int64_t>{kCudnn, kFlash, kEfficient, kMath, kOverrideable}));
  EXPECT_EQ(*AttentionPriority("efficient", kPyTorch),
            (std::vector<int64_t>{kEfficient, kFlash, kMath, kCudnn, kOverrideable}));
  EXPECT_EQ(*AttentionPriority("math", kPyTorch),
            (std::vector<int64_t>{kMath, kFlash, kEfficient, kCudnn, kOverrideable}));
  EXPECT_EQ(DescribeAttentionPriority(*AttentionPriority("cudnn", kPyTorch)),
            "cudnn, flash, efficient, math, overrideable");
}

TEST(AttentionBackend, UnknownNamesAreRefused) {
  for (const char* bad : {"", "FLASH", "fa3", "overrideable", "cudnn,flash"}) {
    StatusOr<std::vector<int64_t>> order = AttentionPriority(bad, kPyTorch);
    ASSERT_FALSE(order.ok()) << bad;
    EXPECT_EQ(order.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(order.status().message().find("auto, flash, cudnn, efficient or math"),
              std::string::npos)
        << order.status().message();
  }
  EXPECT_FALSE(AttentionPriority("cudnn", {kFlash, kMath}).ok());
}

// Note [Compiled attention]: a package compiled under the server's order runs its kernels; one
// compiled under another order, or that does not say, is named in a warning.
TEST(AttentionBackend, CompiledOrdersOtherThanTheServersAreNamed) {
  const std::vector<int64_t> hopper = {kCudnn, kFlash, kEfficient, kMath, kOverrideable};
  EXPECT_EQ(CompiledAttentionMismatch("cudnn, flash, efficient, math, overrideable", hopper), "");
  const std::string other =
      CompiledAttentionMismatch("flash, efficient, math, cudnn, overrideable", hopper);
  EXPECT_NE(other.find("chosen under the order flash, efficient, math, cudnn, overrideable, the "
                       "server runs cudnn, flash, efficient, math, overrideable"),
            std::string::npos)
      << other;
  EXPECT_NE(other.find("--compile-attention"), std::string::npos) << other;
  const std::string unrecorded = CompiledAttentionMismatch("", hopper);
  EXPECT_NE(unrecorded.find("records no attention order"), std::string::npos) << unrecorded;
  EXPECT_NE(unrecorded.find("re-export"), std::string::npos) << unrecorded;
}

TEST(AttentionBackend, ApplyingSetsTheProcessOrderAndAttentionStillRuns) {
  const std::vector<int64_t> before = CurrentAttentionPriority();
  ASSERT_EQ(before.size(), kPyTorch.size());
  StatusOr<std::vector<int64_t>> set = ApplyAttentionBackend("cudnn", -1);
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(CurrentAttentionPriority(), *set);
  EXPECT_EQ(set->front(), kCudnn);
  // On the CPU cuDNN cannot take the call: the next backend runs it, with the same result.
  const at::Tensor q = at::randn({1, 2, 16, 8}), k = at::randn({1, 2, 12, 8}),
                   v = at::randn({1, 2, 12, 8});
  const at::Tensor got = at::scaled_dot_product_attention(q, k, v);
  const at::Tensor want =
      at::matmul(at::softmax(at::matmul(q, k.transpose(-2, -1)) / std::sqrt(8.0), -1), v);
  EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5));
  EXPECT_EQ(*ApplyAttentionBackend("auto", -1), *set);  // auto keeps whatever is set
  at::globalContext().setSDPPriorityOrder(before);
  EXPECT_EQ(CurrentAttentionPriority(), before);
}

}  // namespace
}  // namespace qpool
