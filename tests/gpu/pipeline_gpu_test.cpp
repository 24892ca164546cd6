// The tiny pipelines on GPUs: every tensor (quant state included) lives on the pipeline's device,
// generation works on every GPU, and unloading gives the allocator its bytes back.
#include <c10/cuda/CUDACachingAllocator.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "gpu/gpu_pipeline_fixture.h"

namespace qpool {
namespace {

class PipelineGpuTest : public ::testing::TestWithParam<std::string>,
                        protected testing::GpuPipelineTest {
 protected:
  void SetUp() override {
    std::string skip;
    if (!Prepare(&skip)) GTEST_SKIP() << skip;
  }
};

// Note: "tiny-nf4" is quantized at load time on the CPU and then moved: its quant state must
// follow the weights to the GPU (the field bug: quant_state.code left on cuda:0).
TEST_P(PipelineGpuTest, EveryTensorOnEveryGpuAndUnloadReturnsTheBytes) {
  const std::string name = GetParam();
  if (!Exported(name)) {
    GTEST_SKIP() << name << " not exported";
  }
  for (int index = static_cast<int>(torch::cuda::device_count()) - 1; index >= 0; --index) {
    c10::Device device(c10::kCUDA, static_cast<c10::DeviceIndex>(index));
    torch::empty({1}, torch::TensorOptions().device(device));  // allocator stats need a first use
    // Round 0 warms up (cuBLAS keeps its workspace allocated per stream); round 1 is checked.
    for (int round = 0; round < 2; ++round) {
      c10::cuda::CUDACachingAllocator::emptyCache();
      const int64_t before = Allocated(device);
      uint64_t held = 0;
      {
        auto pipeline = Load(name, device);
        ASSERT_NE(pipeline, nullptr);
        for (const auto& component : pipeline->components()) {
          // Note [Channels-last convolutions]: the UNet's and the decoder's 4-d weights.
          const bool convolutional =
              component->name() == "unet" || component->name() == "vae_decoder";
          EXPECT_EQ(component->weight_memory_format(),
                    convolutional ? c10::MemoryFormat::ChannelsLast : c10::MemoryFormat::Contiguous)
              << name << "/" << component->name();
          for (const auto& named : component->module().named_attributes(/*recurse=*/true)) {
            if (!named.value.isTensor()) continue;
            const torch::Tensor t = named.value.toTensor();
            EXPECT_EQ(t.device(), device) << name << "/" << component->name() << "." << named.name;
            if (convolutional && t.dim() == 4 && t.is_floating_point()) {
              EXPECT_TRUE(t.is_contiguous(c10::MemoryFormat::ChannelsLast))
                  << name << "/" << component->name() << "." << named.name;
            }
          }
          held += component->Bytes().total();
        }
        EXPECT_GE(Allocated(device) - before, static_cast<int64_t>(held) * 9 / 10);
        std::vector<int> steps;
        auto out = pipeline->Generate(
            Params(), [&](int s, int) { steps.push_back(s); }, nullptr);
        ASSERT_TRUE(out.ok()) << out.status().ToString();
        EXPECT_EQ(out->images.size(), 2u);
        EXPECT_EQ(steps, (std::vector<int>{1, 2, 3}));
        auto again = pipeline->Generate(Params(), nullptr, nullptr);
        ASSERT_TRUE(again.ok());
        EXPECT_EQ(again->images[0].png, out->images[0].png) << "same seed, same device, same bytes";
      }
      // Every tensor of the pipeline is gone: allocated bytes are back to the baseline.
      if (round == 1) EXPECT_EQ(Allocated(device), before) << name << " on " << device;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, PipelineGpuTest, ::testing::Values("tiny", "tiny-int8", "tiny-nf4"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace qpool
