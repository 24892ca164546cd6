// CUDA graphs of the denoiser's and the text encoders' forwards (Note [Forward graphs]): a replay
// returns the eager forward's bytes (fp16, int8 and nf4, whose quant_linear kernels run inside
// the graph, a forward compiled by AOTInductor, and a forward returning a tuple); a move, an
// offload or an unload drops the graphs and their memory; text encoders keep graphs only while
// they stay on the device; the cache stays bounded; and the default stream and streamed
// components never capture.
#include <c10/core/InferenceMode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <optional>
#include <utility>

#include "component/graph_cache.h"
#include "gpu/gpu_pipeline_fixture.h"
#include "memory/leak_check.h"

namespace qpool {
namespace {

const c10::Device kGpu(c10::kCUDA, 0);

class GraphGpuTest : public ::testing::Test, protected testing::GpuPipelineTest {
 protected:
  void SetUp() override {
    std::string skip;
    if (!Prepare(&skip)) GTEST_SKIP() << skip;
    torch::empty({1}, torch::TensorOptions().device(kGpu));  // allocator stats need a first use
    // The device worker's situation: a pool stream of its own is current.
    stream_.emplace(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, kGpu.index()));
  }

  static Component& Find(Pipeline& pipeline, const std::string& name) {
    for (const auto& c : pipeline.components()) {
      if (c->name() == name) return *c;
    }
    throw std::logic_error("no component " + name);
  }

  // UNet inputs of `batch` rows: random latents at `size`, a timestep, the text encoder's states.
  static std::vector<c10::IValue> UnetInputs(Pipeline& pipeline, int64_t batch, int64_t size,
                                             uint64_t seed) {
    torch::manual_seed(seed);
    auto ids = torch::randint(1, 400, {batch, pipeline.manifest().tokenizer.max_length},
                              torch::TensorOptions().dtype(torch::kLong).device(kGpu));
    auto hidden = Find(pipeline, "text_encoder").Forward({ids});
    EXPECT_TRUE(hidden.ok()) << hidden.status().ToString();
    const auto half = torch::TensorOptions().dtype(torch::kHalf).device(kGpu);
    auto sample = torch::randn({batch, pipeline.manifest().latent.channels, size, size}, half);
    auto t = torch::full({batch}, 500.0 + static_cast<double>(seed),
                         torch::TensorOptions().dtype(torch::kFloat).device(kGpu));
    return {sample, t, hidden.ok() ? *hidden : torch::Tensor()};
  }

  static torch::Tensor Run(Component& c, const std::vector<c10::IValue>& inputs) {
    auto out = c.Forward(inputs);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    return out.ok() ? *out : torch::Tensor();
  }

  static void Sync() { c10::cuda::device_synchronize(); }

  // Two UNet inputs of one signature and their eager outputs.
  struct EagerPair {
    std::vector<c10::IValue> a, b;
    torch::Tensor eager_a, eager_b;
  };

  // Runs `unet` eagerly on two inputs, then with graphs: the first forward of their signature
  // is the eager warm-up, the second captures and replays, later ones replay; each must return
  // exactly the eager bytes, and a returned tensor stays the caller's (the next replay does not
  // overwrite it).
  static EagerPair ExpectReplaysEqualEager(Pipeline& pipeline, Component& unet,
                                           const std::string& name) {
    EagerPair p{UnetInputs(pipeline, 2, 8, 1), UnetInputs(pipeline, 2, 8, 2), {}, {}};
    unet.EnableGraphs(0);
    p.eager_a = Run(unet, p.a);
    p.eager_b = Run(unet, p.b);
    EXPECT_FALSE(torch::equal(p.eager_a, p.eager_b)) << name;

    unet.EnableGraphs(2);
    EXPECT_TRUE(torch::equal(Run(unet, p.a), p.eager_a)) << name << ": warm-up";
    EXPECT_EQ(unet.graph_stats().captures, 0u);
    const torch::Tensor captured_b = Run(unet, p.b);
    const torch::Tensor replayed_a = Run(unet, p.a);
    const torch::Tensor replayed_b = Run(unet, p.b);
    Sync();
    EXPECT_TRUE(torch::equal(captured_b, p.eager_b)) << name << ": the capturing call";
    EXPECT_TRUE(torch::equal(replayed_a, p.eager_a)) << name << ": a replay";
    EXPECT_TRUE(torch::equal(replayed_b, p.eager_b)) << name << ": a replay";
    EXPECT_TRUE(torch::equal(captured_b, p.eager_b)) << name << ": overwritten by a later replay";
    const GraphStats stats = unet.graph_stats();
    EXPECT_EQ(stats.captures, 1u) << name;
    EXPECT_EQ(stats.replays, 3u) << name;
    EXPECT_EQ(stats.failures, 0u) << name;
    EXPECT_EQ(stats.graphs, 1u) << name;
    EXPECT_GT(unet.Bytes().graph, 0u) << name << ": graph memory is the component's";
    EXPECT_EQ(unet.Bytes().graph, stats.bytes);
    return p;
  }

  std::optional<c10::cuda::CUDAStreamGuard> stream_;
  c10::InferenceMode inference_;
};

// TorchScript UNets, fp16 and quantized.
TEST_F(GraphGpuTest, ReplayEqualsEagerBitForBit) {
  for (const std::string name : {"tiny", "tiny-int8", "tiny-nf4"}) {
    if (!Exported(name)) {
      ADD_FAILURE() << name << " not exported";
      continue;
    }
    auto pipeline = Load(name, kGpu, "none");
    ASSERT_NE(pipeline, nullptr);
    ExpectReplaysEqualEager(*pipeline, Find(*pipeline, "unet"), name);
  }
}

// The same for UNets whose forward is an AOTInductor package compiled for CUDA, fp16 and NF4
// (Note [Compiled forward]; exported at build time where the exporting machine has a GPU): the
// package's kernels, qpool's quantized linear op among them, are captured and replayed, every
// forward ran the package, not TorchScript, and an offload drops the graphs, after which the
// package is bound again and the warm signature captures anew.
TEST_F(GraphGpuTest, CompiledForwardIsCapturedAndReplaysItsEagerBytes) {
  bool any = false;
  for (const std::string name : {"tiny-compiled-cuda", "tiny-nf4-compiled-cuda"}) {
    if (!Exported(name)) continue;
    any = true;
    auto pipeline = Load(name, kGpu, "none");
    ASSERT_NE(pipeline, nullptr);
    Component& unet = Find(*pipeline, "unet");
    const EagerPair p = ExpectReplaysEqualEager(*pipeline, unet, name);
    EXPECT_EQ(unet.compiled_forwards(), 6u) << name << ": every forward ran the package";

    auto offloaded = pipeline->residency().Offload();
    ASSERT_TRUE(offloaded.ok()) << offloaded.status().ToString();
    EXPECT_EQ(unet.Bytes().graph, 0u) << name;
    auto onloaded = pipeline->residency().Onload(kGpu);
    ASSERT_TRUE(onloaded.ok()) << onloaded.status().ToString();
    const torch::Tensor again_a = Run(unet, p.a);
    const torch::Tensor again_b = Run(unet, p.b);
    Sync();
    EXPECT_TRUE(torch::equal(again_a, p.eager_a)) << name << ": after the onload";
    EXPECT_TRUE(torch::equal(again_b, p.eager_b)) << name << ": after the onload";
    EXPECT_EQ(unet.graph_stats().captures, 2u) << name << ": captured again after the move";
    EXPECT_EQ(unet.graph_stats().failures, 0u) << name;
    EXPECT_GT(unet.Bytes().graph, 0u) << name;
    EXPECT_EQ(unet.compiled_forwards(), 8u) << name;
  }
  if (!any) GTEST_SKIP() << "no CUDA-compiled pipeline exported (the build machine had no GPU)";
}

// A request's images are the same bytes with graphs on and off. The first request's loop of
// three steps warms the denoiser up, captures, and replays; its one text encoder forward is the
// encoder's warm-up. The second request replays the denoiser at every step and captures the
// encoder's forward.
TEST_F(GraphGpuTest, GenerateGivesTheSameImagesWithAndWithoutGraphs) {
  for (const std::string name : {"tiny", "tiny-nf4"}) {
    if (!Exported(name)) continue;
    auto off = Load(name, kGpu, "none", nullptr,
                    [](PipelineManifest& m) { m.execution.cuda_graphs = false; });
    auto on = Load(name, kGpu, "none");
    ASSERT_NE(off, nullptr);
    ASSERT_NE(on, nullptr);
    auto expected = off->Generate(Params(), nullptr, nullptr);
    ASSERT_TRUE(expected.ok()) << expected.status().ToString();
    for (int request = 0; request < 2; ++request) {
      auto got = on->Generate(Params(), nullptr, nullptr);
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ASSERT_EQ(got->images.size(), expected->images.size());
      for (size_t i = 0; i < got->images.size(); ++i) {
        EXPECT_EQ(got->images[i].png, expected->images[i].png)
            << name << " request " << request << " image " << i;
      }
    }
    EXPECT_EQ(Find(*off, "unet").graph_stats().captures, 0u);
    EXPECT_EQ(Find(*off, "text_encoder").graph_stats().captures, 0u);
    const GraphStats unet = Find(*on, "unet").graph_stats();
    EXPECT_EQ(unet.captures, 1u) << name;
    EXPECT_EQ(unet.replays, 5u) << name;
    const GraphStats encoder = Find(*on, "text_encoder").graph_stats();
    EXPECT_EQ(encoder.captures, 1u) << name;
    EXPECT_EQ(encoder.replays, 1u) << name;
    EXPECT_EQ(encoder.failures, 0u) << name;
    EXPECT_GT(Find(*on, "text_encoder").Bytes().graph, 0u) << name;
  }
}

// A text encoder keeps graphs only while the policy keeps it on the device between requests:
// under model it runs eagerly, and switching a pipeline to model drops the graphs it held.
TEST_F(GraphGpuTest, TextEncodersReplayOnlyWhileResident) {
  auto model = Load("tiny", kGpu, "model");
  ASSERT_NE(model, nullptr);
  for (int request = 0; request < 3; ++request) {
    ASSERT_TRUE(model->Generate(Params(), nullptr, nullptr).ok());
  }
  EXPECT_EQ(Find(*model, "text_encoder").graph_stats().captures, 0u);
  EXPECT_EQ(Find(*model, "text_encoder").Bytes().graph, 0u);

  auto pipeline = Load("tiny", kGpu, "none");
  ASSERT_NE(pipeline, nullptr);
  Component& encoder = Find(*pipeline, "text_encoder");
  for (int request = 0; request < 3; ++request) {
    ASSERT_TRUE(pipeline->Generate(Params(), nullptr, nullptr).ok());
  }
  EXPECT_EQ(encoder.graph_stats().captures, 1u);
  EXPECT_EQ(encoder.graph_stats().replays, 2u);
  ASSERT_GT(encoder.Bytes().graph, 0u);

  auto parsed = MakeOffloadPolicy("model", 300);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_TRUE(pipeline->residency().SetPolicy(*parsed).ok());
  ASSERT_TRUE(pipeline->Generate(Params(), nullptr, nullptr).ok());
  EXPECT_EQ(encoder.graph_stats().captures, 1u);
  EXPECT_EQ(encoder.graph_stats().graphs, 0u);
  EXPECT_EQ(encoder.Bytes().graph, 0u);
}

// A forward returning a tuple of tensors (SDXL's second text encoder: hidden states and pooled
// embedding) is captured and replayed as a tuple of copies the caller owns; one returning
// anything else fails its capture, and the cache runs eagerly from then on.
TEST_F(GraphGpuTest, TupleOutputsReplayAsCopies) {
  torch::jit::Module m("Pair");
  m.define(R"JIT(
    def forward(self, x):
        return (torch.relu(x) * 2.0, x.sum(1))
  )JIT");
  auto forward = [&m](std::vector<c10::IValue> in) { return m.forward(std::move(in)); };
  const auto opts = torch::TensorOptions().device(kGpu);
  const torch::Tensor a = torch::randn({4, 8}, opts), b = torch::randn({4, 8}, opts);
  GraphCache cache("text_encoder_2", 2);
  EXPECT_FALSE(cache.Run({a}, forward)) << "the first forward of a signature is the warm-up";
  auto captured = cache.Run({a}, forward);
  auto replayed = cache.Run({b}, forward);
  ASSERT_TRUE(captured && replayed);
  Sync();
  for (const auto& [out, x] : {std::pair{*captured, a}, std::pair{*replayed, b}}) {
    ASSERT_TRUE(out.isTuple());
    const auto& elements = out.toTupleRef().elements();
    ASSERT_EQ(elements.size(), 2u);
    EXPECT_TRUE(torch::equal(elements[0].toTensor(), torch::relu(x) * 2.0));
    EXPECT_TRUE(torch::equal(elements[1].toTensor(), x.sum(1)));
  }
  EXPECT_EQ(cache.stats().captures, 1u);
  EXPECT_EQ(cache.stats().replays, 2u);

  torch::jit::Module bad("Listed");
  bad.define(R"JIT(
    def forward(self, x):
        return [x * 2.0]
  )JIT");
  GraphCache refused("listed", 2);
  auto listed = [&bad](std::vector<c10::IValue> in) { return bad.forward(std::move(in)); };
  EXPECT_FALSE(refused.Run({a}, listed));
  EXPECT_FALSE(refused.Run({a}, listed)) << "a list is not replayed";
  EXPECT_EQ(refused.stats().failures, 1u);
  EXPECT_EQ(refused.bytes(), 0u);
  EXPECT_FALSE(refused.Run({a}, listed));
  EXPECT_EQ(refused.stats().captures, 0u);
}

// An offload rebinds the UNet's tensors: its graphs go, with their memory pools (reserved bytes
// fall by as much), and the next request captures again on the device.
TEST_F(GraphGpuTest, OffloadDropsTheGraphsAndTheirMemory) {
  auto pipeline = Load("tiny", kGpu, "none");
  ASSERT_NE(pipeline, nullptr);
  Component& unet = Find(*pipeline, "unet");
  ASSERT_TRUE(pipeline->Generate(Params(), nullptr, nullptr).ok());
  Sync();
  const uint64_t graph_bytes = unet.Bytes().graph;
  ASSERT_GT(graph_bytes, 0u);
  const uint64_t reserved = memory_.Read(kGpu).reserved_bytes;

  auto offloaded = pipeline->residency().Offload();
  ASSERT_TRUE(offloaded.ok()) << offloaded.status().ToString();
  Sync();
  EXPECT_EQ(unet.Bytes().graph, 0u);
  EXPECT_EQ(unet.graph_stats().graphs, 0u);
  const uint64_t reserved_after = memory_.Read(kGpu).reserved_bytes;
  // The static inputs sit in the ordinary pool (small blocks of one 2 MiB segment at most).
  EXPECT_GE(reserved - reserved_after + (2u << 20), graph_bytes)
      << "the graphs' pools went back to the driver";

  auto onloaded = pipeline->residency().Onload(kGpu);
  ASSERT_TRUE(onloaded.ok()) << onloaded.status().ToString();
  ASSERT_TRUE(pipeline->Generate(Params(), nullptr, nullptr).ok());
  EXPECT_EQ(unet.graph_stats().captures, 2u) << "captured again after the move";
  EXPECT_GT(unet.Bytes().graph, 0u);
}

// Under the model policy the UNet goes back to the host after the loop: no graph survives the
// request, and the device holds nothing of the pipeline afterwards.
TEST_F(GraphGpuTest, ModelPolicyLeavesNoGraphBehind) {
  auto warm = Load("tiny", kGpu, "none");  // cuBLAS keeps a workspace per stream for good
  ASSERT_NE(warm, nullptr);
  ASSERT_TRUE(warm->Generate(Params(), nullptr, nullptr).ok());
  warm.reset();
  c10::cuda::CUDACachingAllocator::emptyCache();
  const int64_t base = Allocated(kGpu);
  auto pipeline = Load("tiny", kGpu, "model");
  ASSERT_NE(pipeline, nullptr);
  ASSERT_TRUE(pipeline->Generate(Params(), nullptr, nullptr).ok());
  Sync();
  Component& unet = Find(*pipeline, "unet");
  EXPECT_EQ(unet.graph_stats().captures, 1u);
  EXPECT_EQ(unet.Bytes().graph, 0u);
  EXPECT_EQ(Find(*pipeline, "text_encoder").graph_stats().captures, 0u);
  EXPECT_EQ(Allocated(kGpu), base);
}

// Unloading a pipeline whose UNet holds graphs gives every byte back: the leak check finds
// nothing and the allocator's allocated bytes return to the baseline.
TEST_F(GraphGpuTest, UnloadWithGraphsLeavesNothing) {
  for (const std::string name : {"tiny", "tiny-int8"}) {
    if (!Exported(name)) continue;
    {
      auto warm = Load(name, kGpu, "none");
      ASSERT_NE(warm, nullptr);
      ASSERT_TRUE(warm->Generate(Params(), nullptr, nullptr).ok());
    }
    c10::cuda::CUDACachingAllocator::emptyCache();
    const int64_t base = Allocated(kGpu);
    auto pipeline = Load(name, kGpu, "none");
    ASSERT_NE(pipeline, nullptr);
    ASSERT_TRUE(pipeline->Generate(Params(), nullptr, nullptr).ok());
    ASSERT_GT(Find(*pipeline, "unet").Bytes().graph, 0u);
    Sync();
    LeakCheck check(&memory_, pipeline->residency().Blocks(), kGpu);
    pipeline.reset();
    EXPECT_EQ(check.Finish().leaked_bytes(), 0u) << name;
    EXPECT_EQ(Allocated(kGpu), base) << name;
  }
}

// At most max_graphs shapes keep a graph; the least recently used goes first.
TEST_F(GraphGpuTest, TheCacheIsBounded) {
  auto pipeline = Load("tiny", kGpu, "none");
  ASSERT_NE(pipeline, nullptr);
  Component& unet = Find(*pipeline, "unet");
  unet.EnableGraphs(2);
  for (int64_t batch : {1, 2, 4}) {
    const auto in = UnetInputs(*pipeline, batch, 8, static_cast<uint64_t>(batch));
    for (int i = 0; i < 3; ++i) Run(unet, in);
  }
  GraphStats stats = unet.graph_stats();
  EXPECT_EQ(stats.captures, 3u);
  EXPECT_EQ(stats.graphs, 2u);
  // Batch 1 was dropped: it warms up no more, but captures again.
  Run(unet, UnetInputs(*pipeline, 1, 8, 1));
  EXPECT_EQ(unet.graph_stats().captures, 4u);
  unet.EnableGraphs(0);
  EXPECT_EQ(unet.graph_stats().graphs, 0u);
  EXPECT_EQ(unet.Bytes().graph, 0u);
}

// A streamed UNet rebinds its tensors during its forward: it never captures, and its images are
// the resident pipeline's.
TEST_F(GraphGpuTest, StreamingNeverCaptures) {
  OffloadPolicy sequential;
  sequential.mode = OffloadMode::kSequential;
  sequential.stream.group_mib = 0;
  auto resident = Load("tiny", kGpu, "none");
  auto streamed = Load("tiny", kGpu, "", &sequential);
  ASSERT_NE(resident, nullptr);
  ASSERT_NE(streamed, nullptr);
  auto expected = resident->Generate(Params(), nullptr, nullptr);
  auto got = streamed->Generate(Params(), nullptr, nullptr);
  ASSERT_TRUE(expected.ok() && got.ok()) << got.status().ToString();
  EXPECT_EQ(got->images[0].png, expected->images[0].png);
  EXPECT_EQ(Find(*streamed, "unet").graph_stats().captures, 0u);
  EXPECT_EQ(Find(*streamed, "unet").graph_stats().failures, 0u);
}

// A capture needs a stream of its own: on the default stream the forward runs eagerly.
TEST_F(GraphGpuTest, TheDefaultStreamNeverCaptures) {
  stream_.reset();
  ASSERT_EQ(c10::cuda::getCurrentCUDAStream(), c10::cuda::getDefaultCUDAStream());
  auto pipeline = Load("tiny", kGpu, "none");
  ASSERT_NE(pipeline, nullptr);
  ASSERT_TRUE(pipeline->Generate(Params(), nullptr, nullptr).ok());
  EXPECT_EQ(Find(*pipeline, "unet").graph_stats().captures, 0u);
  EXPECT_EQ(Find(*pipeline, "unet").graph_stats().failures, 0u);
}

}  // namespace
}  // namespace qpool
