// qpool::rope on CUDA (Note [Rotary embedding op]): the one-pass kernel gives the CPU kernel's
// bytes and those of the ATen operations diffusers runs on the GPU, in every dtype, with 16-byte
// and pair-wise access, for non-contiguous x, and inside a CUDA graph. qpool::rms_rope (Note
// [Normed rotary embedding op]): within a unit of the dtype of the unfused operations, for views,
// every head-size path, and inside a CUDA graph.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "quant/rope_op.h"
#include "testing/op_schemas.h"

namespace qpool::quant {
namespace {

#define SKIP_WITHOUT_CUDA() \
  if (!torch::cuda::is_available()) GTEST_SKIP() << "CUDA is not available; GPU test skipped"

struct Tables {
  at::Tensor cos, sin;
};

Tables MakeTables(int64_t n, int64_t d) {
  const at::Tensor angles = at::rand({1, n, 1, d}) * 100;
  return {at::cos(angles), at::sin(angles)};
}

TEST(RopeCuda, EqualsTheCpuAndTheAtenOperationsByteForByte) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(31);
  struct Shape {
    int64_t b, n, h, d;
  };
  // FLUX's head size (16-byte access), a head size of pairs only (6), odd token counts.
  for (const Shape& sh : {Shape{1, 77, 24, 128}, Shape{2, 33, 3, 6}, Shape{3, 5, 2, 16}}) {
    const Tables t = MakeTables(sh.n, sh.d);
    const at::Tensor gc = t.cos.cuda(), gs = t.sin.cuda();
    for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16}) {
      const at::Tensor x = at::randn({sh.b, sh.n, sh.h, sh.d}).to(type);
      const std::string what = std::string(c10::toString(type)) + " d " + std::to_string(sh.d);
      const at::Tensor got = Rope(x.cuda(), gc, gs);
      EXPECT_TRUE(at::equal(got.cpu(), Rope(x, t.cos, t.sin))) << what;
      EXPECT_TRUE(at::equal(got, RopeCpu(x.cuda(), gc, gs))) << what << " (ATen on the GPU)";
    }
  }
}

TEST(RopeCuda, NonContiguousAndMisalignedInputs) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(32);
  const Tables t = MakeTables(9, 16);
  const at::Tensor gc = t.cos.cuda(), gs = t.sin.cuda();
  // x as FLUX's heads view of a projection: [B, N, H * D] -> [B, N, H, D], every other token.
  const at::Tensor wide = at::randn({2, 18, 4 * 16}, at::kCUDA).to(at::kBFloat16);
  const at::Tensor strided = wide.unflatten(-1, {4, 16}).slice(1, 0, 18, 2);
  ASSERT_FALSE(strided.is_contiguous());
  EXPECT_TRUE(at::equal(Rope(strided, gc, gs), RopeCpu(strided, gc, gs)));
  // A view starting 2 bytes into its storage: the pair-wise path.
  const at::Tensor flat = at::randn({1 + 2 * 9 * 3 * 16}, at::kCUDA).to(at::kHalf);
  const at::Tensor shifted = flat.slice(0, 1).view({2, 9, 3, 16});
  EXPECT_TRUE(at::equal(Rope(shifted, gc, gs), RopeCpu(shifted, gc, gs)));
  // Tables on another device than x are refused, naming both.
  const at::Tensor x = at::randn({1, 9, 3, 16}, at::kCUDA);
  try {
    Rope(x, t.cos, gs);
    FAIL() << "cos on the CPU was accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cos is on cpu but x is on cuda:0"), std::string::npos)
        << e.what();
  }
}

TEST(RopeCuda, CapturesIntoACudaGraph) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(33);
  const Tables t = MakeTables(64, 128);
  const at::Tensor gc = t.cos.cuda(), gs = t.sin.cuda();
  const at::Tensor x = at::randn({1, 64, 4, 128}, at::kCUDA).to(at::kBFloat16);
  const at::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  at::Tensor captured;
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    Rope(x, gc, gs);
    graph.capture_begin();
    captured = Rope(x, gc, gs);
    graph.capture_end();
  }
  const at::Tensor next = at::randn_like(x);
  x.copy_(next);
  torch::cuda::synchronize();  // the copy, on the default stream, before the replay
  {
    c10::cuda::CUDAStreamGuard guard(side);
    graph.replay();
  }
  side.synchronize();
  EXPECT_TRUE(at::equal(captured, RopeCpu(next, gc, gs)));
}

using testing::ExpectCloseToTheUnfusedOps;

TEST(RmsRopeCuda, EqualsTheUnfusedOperations) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(34);
  struct Shape {
    int64_t text, image, h, d;
  };
  // FLUX's double-stream q (text and image tokens as views of a fused projection), head sizes
  // of one, two and four pairs per lane, a head size of pairs only, and one past the kernel's
  // registers (the ATen operations).
  for (const Shape& sh : {Shape{512, 4096, 24, 128}, Shape{3, 17, 2, 64}, Shape{0, 9, 3, 256},
                          Shape{2, 5, 3, 6}, Shape{1, 4, 2, 320}}) {
    const int64_t tokens = sh.text + sh.image;
    const Tables t = MakeTables(tokens, sh.d);
    const at::Tensor gc = t.cos.cuda(), gs = t.sin.cuda();
    for (at::ScalarType type : {at::kFloat, at::kHalf, at::kBFloat16}) {
      const auto view = [&](int64_t n) {  // q of a [B, n, 3 * H * D] q / k / v projection
        return at::randn({1, n, 3 * sh.h * sh.d}, at::kCUDA)
            .to(type)
            .slice(2, 0, sh.h * sh.d)
            .unflatten(-1, {sh.h, sh.d});
      };
      std::vector<at::Tensor> xs, ws;
      if (sh.text > 0) xs.push_back(view(sh.text));
      xs.push_back(view(sh.image));
      for (size_t i = 0; i < xs.size(); ++i) ws.push_back(at::randn({sh.d}, at::kCUDA).to(type));
      const std::string what = std::string(c10::toString(type)) + " d " + std::to_string(sh.d) +
                               " parts " + std::to_string(xs.size());
      const at::Tensor got = RmsRope(xs, ws, 1e-6, gc, gs);
      ExpectCloseToTheUnfusedOps(got, RmsRopeCpu(xs, ws, 1e-6, gc, gs),
                                 what + " (ATen on the GPU)");
      std::vector<at::Tensor> cpu_xs, cpu_ws;
      for (size_t i = 0; i < xs.size(); ++i) {
        cpu_xs.push_back(xs[i].cpu());
        cpu_ws.push_back(ws[i].cpu());
      }
      ExpectCloseToTheUnfusedOps(got.cpu(), RmsRope(cpu_xs, cpu_ws, 1e-6, t.cos, t.sin),
                                 what + " (the CPU)");
    }
  }
}

TEST(RmsRopeCuda, MisalignedViewsAndCapture) {
  SKIP_WITHOUT_CUDA();
  torch::manual_seed(35);
  const Tables t = MakeTables(64, 128);
  const at::Tensor gc = t.cos.cuda(), gs = t.sin.cuda();
  // A view starting one value into its storage.
  const at::Tensor flat = at::randn({1 + 64 * 4 * 128}, at::kCUDA).to(at::kBFloat16);
  const at::Tensor shifted = flat.slice(0, 1).view({1, 64, 4, 128});
  const at::Tensor w = at::randn({128}, at::kCUDA).to(at::kBFloat16);
  ExpectCloseToTheUnfusedOps(RmsRope({shifted}, {w}, 1e-6, gc, gs),
                             RmsRopeCpu({shifted}, {w}, 1e-6, gc, gs), "shifted view");
  // A weight of another dtype than x is converted, as aten::rms_norm's output keeps x's.
  const at::Tensor x = at::randn({1, 64, 4, 128}, at::kCUDA).to(at::kBFloat16);
  ExpectCloseToTheUnfusedOps(RmsRope({x}, {w.to(at::kFloat)}, 1e-6, gc, gs),
                             RmsRope({x}, {w}, 1e-6, gc, gs), "float32 weight");
  const at::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  at::Tensor captured;
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    RmsRope({x}, {w}, 1e-6, gc, gs);
    graph.capture_begin();
    captured = RmsRope({x}, {w}, 1e-6, gc, gs);
    graph.capture_end();
  }
  const at::Tensor next = at::randn_like(x);
  x.copy_(next);
  torch::cuda::synchronize();
  {
    c10::cuda::CUDAStreamGuard guard(side);
    graph.replay();
  }
  side.synchronize();
  EXPECT_TRUE(at::equal(captured, RmsRope({next}, {w}, 1e-6, gc, gs)));
}

}  // namespace
}  // namespace qpool::quant
