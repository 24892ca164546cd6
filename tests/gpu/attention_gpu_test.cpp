// --attention on a GPU (Note [Attention backend]): each backend put first is the one ATen runs
// where it can take the call, gives attention within its dtype's rounding of a float32
// reference, and cuDNN's attention captures into a CUDA graph and replays its eager bytes (the
// denoiser's graphs, Note [CUDA graphs], capture whatever attention kernel runs).
#include <ATen/Context.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGraph.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "component/attention_backend.h"

namespace qpool {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "CUDA is not available; GPU test skipped"

struct Shape {
  int64_t batch, heads, lq, lkv, head_dim;
  at::ScalarType dtype;
  std::string What() const {
    return std::to_string(batch) + "x" + std::to_string(heads) + " Lq " + std::to_string(lq) +
           " Lkv " + std::to_string(lkv) + " d " + std::to_string(head_dim) + " " +
           c10::toString(dtype);
  }
};

// The head sizes and dtypes of SD 1.5 (40, 80, 160), SDXL (64) and FLUX (128, bf16), with a
// cross-attention length of 77, at sizes that keep the test short.
const Shape kShapes[] = {
    {2, 8, 1024, 1024, 40, at::kHalf},       {2, 8, 1024, 77, 40, at::kHalf},
    {2, 8, 256, 256, 80, at::kHalf},         {2, 8, 64, 64, 160, at::kHalf},
    {2, 10, 1024, 1024, 64, at::kHalf},      {2, 10, 1024, 77, 64, at::kHalf},
    {1, 24, 1024, 1024, 128, at::kBFloat16},
};

// Restores the process's attention order (ATen's own, settled) when a test ends.
class AttentionGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (torch::cuda::is_available()) SettleAttentionOrder(0);
    before_ = CurrentAttentionPriority();
  }
  void TearDown() override { at::globalContext().setSDPPriorityOrder(before_); }
  std::vector<int64_t> before_;
};

// First in this file, so that it makes the process's first attention call: ATen settles its
// order then and, on Hopper with a recent cuDNN, used to replace the order a server had set at
// start (Note [Attention backend]). An order applied before any attention ran holds. It stays
// set: the tests below set the orders they need.
TEST(AttentionGpuFirstCall, AnOrderAppliedAtStartHoldsThroughTheFirstCall) {
  SKIP_WITHOUT_CUDA();
  StatusOr<std::vector<int64_t>> set = ApplyAttentionBackend("flash", 0);
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kHalf);
  const at::Tensor q = at::randn({1, 2, 128, 64}, opts);
  (void)at::scaled_dot_product_attention(q, q, q);
  EXPECT_EQ(CurrentAttentionPriority(), *set);
  EXPECT_EQ(DescribeAttentionPriority({at::_fused_sdp_choice(q, q, q)}), "flash");
}

TEST_F(AttentionGpu, EachBackendFirstRunsWhereItCanAndMatchesFloat32) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(3);
  const cudaDeviceProp* props = at::cuda::getCurrentDeviceProperties();
  const bool hopper = props->major == 9;
  for (const Shape& s : kShapes) {
    auto opts = at::TensorOptions().device(at::kCUDA).dtype(s.dtype);
    const at::Tensor q = at::randn({s.batch, s.heads, s.lq, s.head_dim}, opts);
    const at::Tensor k = at::randn({s.batch, s.heads, s.lkv, s.head_dim}, opts);
    const at::Tensor v = at::randn({s.batch, s.heads, s.lkv, s.head_dim}, opts);
    const at::Tensor scores = at::matmul(q.to(at::kFloat), k.to(at::kFloat).transpose(-2, -1)) /
                              std::sqrt(static_cast<double>(s.head_dim));
    const at::Tensor ref = at::matmul(at::softmax(scores, -1), v.to(at::kFloat));
    const double tol = s.dtype == at::kHalf ? 2e-3 : 1.6e-2;
    for (const char* name : {"flash", "cudnn", "efficient", "math"}) {
      ASSERT_TRUE(ApplyAttentionBackend(name, 0).ok());
      const std::string chosen = DescribeAttentionPriority({at::_fused_sdp_choice(q, k, v)});
      const std::string what = s.What() + " " + name + " first, ran " + chosen;
      // Each named backend takes every shape here on Hopper except cuDNN above 128.
      if (hopper && (std::string(name) != "cudnn" || s.head_dim <= 128)) {
        EXPECT_EQ(chosen, name) << what;
      }
      const at::Tensor got = at::scaled_dot_product_attention(q, k, v).to(at::kFloat);
      const double err = (got - ref).abs().max().item<double>() / ref.abs().max().item<double>();
      EXPECT_LE(err, tol) << what;
      at::globalContext().setSDPPriorityOrder(before_);
    }
  }
}

TEST_F(AttentionGpu, CudnnAttentionCapturesAndReplaysItsEagerBytes) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(4);
  ASSERT_TRUE(ApplyAttentionBackend("cudnn", 0).ok());
  for (const Shape& s : {kShapes[4], kShapes[5], kShapes[6]}) {
    auto opts = at::TensorOptions().device(at::kCUDA).dtype(s.dtype);
    const at::Tensor q = at::randn({s.batch, s.heads, s.lq, s.head_dim}, opts);
    const at::Tensor k = at::randn({s.batch, s.heads, s.lkv, s.head_dim}, opts);
    const at::Tensor v = at::randn({s.batch, s.heads, s.lkv, s.head_dim}, opts);
    const std::string chosen = DescribeAttentionPriority({at::_fused_sdp_choice(q, k, v)});
    const at::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
    at::Tensor eager, captured;
    at::cuda::CUDAGraph graph;
    {
      c10::cuda::CUDAStreamGuard guard(side);
      eager = at::scaled_dot_product_attention(q, k, v);  // warm-up: plans built outside capture
      graph.capture_begin();
      captured = at::scaled_dot_product_attention(q, k, v);
      graph.capture_end();
      graph.replay();
    }
    side.synchronize();
    EXPECT_TRUE(at::equal(captured, eager)) << s.What() << " ran " << chosen;
    // New inputs copied into the captured ones give the eager result on them.
    const at::Tensor q2 = at::randn_like(q);
    q.copy_(q2);
    torch::cuda::synchronize();  // the copy, on the default stream, before the replay
    {
      c10::cuda::CUDAStreamGuard guard(side);
      graph.replay();
    }
    side.synchronize();
    EXPECT_TRUE(at::equal(captured, at::scaled_dot_product_attention(q2, k, v)))
        << s.What() << " ran " << chosen;
  }
}

}  // namespace
}  // namespace qpool
