// StageTimer on a GPU: a stage is the time the device took, not the time the host took to queue
// it (Note [Stage timings]).
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>

#include "pipeline/stage_timer.h"

namespace qpool {
namespace {

TEST(StageTimerGpu, StagesAreTheDevicesTimeOnTheCurrentStream) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const c10::Device device(c10::kCUDA, 0);
  c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool(false, 0));
  const auto opts = torch::TensorOptions().device(device).dtype(torch::kHalf);
  torch::Tensor a = torch::randn({8192, 8192}, opts);
  torch::Tensor c = a.mm(a);  // warm cuBLAS
  c10::cuda::getCurrentCUDAStream().synchronize();

  StageTimer timer(device);
  const auto start = std::chrono::steady_clock::now();
  const size_t begin = timer.Mark();
  for (int i = 0; i < 40; ++i) c = a.mm(a);
  const size_t end = timer.Mark();
  const double queued =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  c10::cuda::getCurrentCUDAStream().synchronize();
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  const double stage = timer.Seconds(begin, end);
  EXPECT_GT(stage, queued) << "the host queued 40 products faster than the device ran them";
  EXPECT_LE(stage, wall);
  EXPECT_GE(stage, 0.7 * wall);
}

}  // namespace
}  // namespace qpool
