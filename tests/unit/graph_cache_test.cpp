// CUDA graphs of a forward (Note [Forward graphs]) where there is nothing to capture: CPU inputs
// and components run eagerly, never capture and hold no graph bytes. The GPU side is
// tests/gpu/graph_gpu_test.cpp.
#include "component/graph_cache.h"

#include <gtest/gtest.h>

#include "component/component.h"
#include "testing/test_paths.h"

namespace qpool {
namespace {

TEST(GraphSignature, RefusesWhatAGraphCannotReplay) {
  EXPECT_FALSE(GraphSignature({torch::ones({2, 3})})) << "a CPU tensor";
  EXPECT_FALSE(GraphSignature({c10::IValue(int64_t{3}), c10::IValue(1.5)})) << "no tensor";
  EXPECT_FALSE(GraphSignature({}));
  EXPECT_FALSE(GraphSignature({c10::IValue(std::string("text"))}));
}

TEST(GraphCache, CpuInputsRunEagerly) {
  GraphCache cache("unet", 4);
  int calls = 0;
  auto forward = [&calls](std::vector<c10::IValue> in) {
    ++calls;
    return c10::IValue(in[0].toTensor() * 2);
  };
  for (int i = 0; i < 3; ++i) {
    EXPECT_FALSE(cache.Run({torch::ones({2, 2})}, forward));
  }
  EXPECT_EQ(calls, 0) << "the caller runs the forward itself";
  const GraphStats stats = cache.stats();
  EXPECT_EQ(stats.captures, 0u);
  EXPECT_EQ(stats.graphs, 0u);
  EXPECT_EQ(cache.bytes(), 0u);
}

TEST(GraphCache, CapacityZeroIsOff) {
  GraphCache cache("unet", 0);
  EXPECT_EQ(cache.capacity(), 0u);
  EXPECT_FALSE(cache.Run({torch::ones({1})}, [](std::vector<c10::IValue> in) { return in[0]; }));
  cache.set_capacity(3);
  EXPECT_EQ(cache.capacity(), 3u);
  cache.Clear();
  EXPECT_EQ(cache.bytes(), 0u);
}

// A component on the CPU with graphs enabled computes as before and holds no graph bytes.
TEST(GraphCache, CpuComponentNeverCaptures) {
  torch::jit::Module m("Scale");
  m.register_parameter("weight", torch::full({4, 4}, 0.5), /*is_buffer=*/false);
  m.define(R"JIT(
    def forward(self, x):
        return torch.matmul(x, self.weight)
  )JIT");
  const std::string path = testing::MakeTempDir("graph-cache") + "/component.pt";
  m.save(path);
  auto c = Component::Load("unet", path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  (*c)->EnableGraphs(4);
  const torch::Tensor x = torch::arange(8, torch::kFloat).reshape({2, 4});
  const torch::Tensor expected = torch::matmul(x, torch::full({4, 4}, 0.5));
  for (int i = 0; i < 3; ++i) {
    auto out = (*c)->Forward({x});
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_TRUE(torch::equal(*out, expected));
  }
  EXPECT_EQ((*c)->graph_stats().captures, 0u);
  EXPECT_EQ((*c)->Bytes().graph, 0u);
  EXPECT_EQ((*c)->Bytes().total(), 16u * 4);
}

}  // namespace
}  // namespace qpool
