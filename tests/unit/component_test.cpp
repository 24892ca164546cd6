// Component: every tensor slot is owned, moved, typed and accounted; tensor constants are refused.
#include "component/component.h"

#include <gtest/gtest.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/csrc/jit/serialization/import.h>

#include <thread>

#include "testing/test_paths.h"

namespace qpool {
namespace {

// A module with a parameter, an int buffer, a float buffer, quant-state-named buffers and a
// plain tensor attribute in a submodule: the slots TorchScript's own to() handles differently.
torch::jit::Module MakeModule() {
  torch::jit::Module inner("Inner");
  inner.register_parameter("weight", torch::ones({4, 4}), /*is_buffer=*/false);
  inner.register_buffer("absmax", torch::full({4}, 2.0));
  inner.register_buffer("code", torch::linspace(-1, 1, 16));
  inner.register_attribute("table", c10::TensorType::get(), torch::arange(8, torch::kFloat));
  inner.define(R"JIT(
    def forward(self, x):
        return torch.matmul(x, self.weight) * self.absmax[0]
  )JIT");
  torch::jit::Module outer("Outer");
  outer.register_module("inner", inner);
  outer.register_buffer("position_ids", torch::arange(77, torch::kLong));
  outer.register_buffer("freqs", torch::ones({3}));
  outer.define(R"JIT(
    def forward(self, x):
        return self.inner.forward(x) + self.freqs[0]
  )JIT");
  return outer;
}

std::string SaveModule(const torch::jit::Module& m, const std::string& tag) {
  const std::string path = testing::MakeTempDir(tag) + "/component.pt";
  m.save(path);
  return path;
}

TEST(Component, RolesByName) {
  EXPECT_EQ(RoleOf("weight", false), TensorRole::kWeight);
  EXPECT_EQ(RoleOf("bias", false), TensorRole::kWeight);
  EXPECT_EQ(RoleOf("anything", true), TensorRole::kWeight);
  for (const char* name : {"absmax", "code", "nested_absmax", "nested_code", "offset"}) {
    EXPECT_EQ(RoleOf(name, false), TensorRole::kQuantState) << name;
  }
  EXPECT_EQ(RoleOf("position_ids", false), TensorRole::kOther);
}

TEST(Component, LoadsAndAccountsEveryTensor) {
  auto c = Component::Load("text_encoder", SaveModule(MakeModule(), "component-load"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->num_tensors(), 6u);
  ComponentBytes b = (*c)->Bytes();
  EXPECT_EQ(b.weight, 16u * 4);
  EXPECT_EQ(b.quant_state, (4u + 16u) * 4);
  EXPECT_EQ(b.other, 8u * 4 + 77u * 8 + 3u * 4);
  EXPECT_EQ(b.total(), b.weight + b.quant_state + b.other);
  EXPECT_EQ((*c)->quantization(), "none");
  auto out = (*c)->Forward({torch::ones({2, 4})});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(torch::allclose(*out, torch::full({2, 4}, 9.0)));
}

// Bytes() is cached (Note [Cached byte counts]); each way the slots change must drop the cache.
TEST(Component, ByteCountsFollowEveryChangeOfTheTensors) {
  auto loaded = Component::Load("unet", SaveModule(MakeModule(), "component-bytes"));
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  Component& c = **loaded;
  const ComponentBytes before = c.Bytes();
  EXPECT_EQ(c.Bytes().total(), before.total());  // read twice, the same

  size_t weight = c.num_tensors();
  for (size_t i = 0; i < c.num_tensors(); ++i) {
    if (c.slot_name(i) == "inner.weight") weight = i;
  }
  ASSERT_LT(weight, c.num_tensors());
  c.RebindOne(weight, torch::ones({4, 4}, torch::kHalf));  // one slot, half the bytes
  EXPECT_EQ(c.Bytes().weight, 16u * 2);
  EXPECT_EQ(c.Bytes().quant_state, before.quant_state);

  std::vector<torch::Tensor> doubled;
  for (const auto& t : c.Tensors()) doubled.push_back(torch::cat({t, t}));  // every slot twice
  c.Rebind(doubled, c10::Device(c10::kCPU), c10::kHalf);
  EXPECT_EQ(c.Bytes().total(), 2 * (before.total() - 16u * 2));

  c.module().attr("inner").toModule().setattr("absmax", torch::zeros({1}));
  c.Refresh();  // after module() edits
  EXPECT_EQ(c.Bytes().quant_state, 4u + 2 * 16u * 4);
}

// Note [TorchScript executor]: LibTorch's switch is per thread, and a device worker is not the
// thread that loaded the component. The profiling executor's first run of a graph would be its
// profiling run, whose graph holds prim::profile nodes.
TEST(Component, EveryThreadRunsTheGraphAsExported) {
  auto c = Component::Load("text_encoder", SaveModule(MakeModule(), "component-executor"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  for (int worker = 0; worker < 2; ++worker) {
    std::string ran;
    bool optimizing_after = false;
    std::thread([&] {
      for (int call = 0; call < 3; ++call) {
        auto out = (*c)->Forward({torch::ones({2, 4})});
        ASSERT_TRUE(out.ok()) << out.status().ToString();
        EXPECT_TRUE(at::equal(*out, torch::full({2, 4}, 9.0)));
        ran += torch::jit::lastExecutedOptimizedGraph()->toString();
      }
      optimizing_after = torch::jit::getGraphExecutorOptimize();
    }).join();
    EXPECT_EQ(ran.find("prim::profile"), std::string::npos) << "worker " << worker << ":\n" << ran;
    // The thread's own setting is left as it was.
    EXPECT_TRUE(optimizing_after);
  }
}

TEST(Component, ForwardErrorsAreStatusesNotExceptions) {
  auto c = Component::Load("unet", SaveModule(MakeModule(), "component-forward-error"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  // The TorchScript interpreter turns the op's c10::Error into a std::runtime_error; it must
  // still come back as a status naming the component and the op's message, on one line.
  auto out = (*c)->Forward({torch::ones({2, 3})});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInternal);
  const std::string& message = out.status().message();
  EXPECT_EQ(message.rfind("component 'unet' failed: ", 0), 0u) << message;
  EXPECT_NE(message.find("cannot be multiplied"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(Component, RefusesTensorConstantsNamingTheNode) {
  torch::jit::Module m("Baked");
  m.define(R"JIT(
    def forward(self, x):
        return x
  )JIT");
  auto graph = m.get_method("forward").graph();
  torch::jit::Value* x = graph->inputs()[1];
  torch::jit::Value* sum;
  {
    torch::jit::WithInsertPoint guard(graph->return_node());
    torch::jit::Value* baked = graph->insertConstant(torch::ones({5}));
    sum = graph->insert(c10::aten::add, {x, baked});
  }
  graph->return_node()->replaceInput(0, sum);
  auto c = Component::Load("vae_decoder", SaveModule(m, "component-const"));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("tensor constant of shape [5]"), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("component.pt"), std::string::npos);
}

TEST(Component, GraphCallsFindsAnOperatorInSubmodulesAndBlocks) {
  torch::jit::Module inner("Inner");
  inner.define(R"JIT(
    def forward(self, x):
        if bool(x.sum() > 0):
            return torch.relu(x)
        return x
  )JIT");
  torch::jit::Module outer("Outer");
  outer.register_module("inner", inner);
  outer.define(R"JIT(
    def forward(self, x):
        return self.inner.forward(x) * 2
  )JIT");
  EXPECT_TRUE(GraphCalls(outer, "aten::mul"));
  EXPECT_TRUE(GraphCalls(outer, "aten::relu"));  // in the submodule, inside an if
  EXPECT_FALSE(GraphCalls(outer, "aten::sigmoid"));
  EXPECT_FALSE(GraphCalls(outer, "qpool::group_norm"));
  EXPECT_FALSE(GraphCalls(inner, "aten::mul"));
}

TEST(Component, GraphWaitsOnHostFindsTheOperatorsThatReadDeviceValues) {
  const auto module = [](const std::string& name, const std::string& body) {
    torch::jit::Module m(name);
    m.define("def forward(self, x):\n    return " + body + "\n");
    return m;
  };
  EXPECT_TRUE(
      GraphWaitsOnHost(module("Routed", "x.index_select(0, torch.nonzero(x > 0).flatten())")));
  EXPECT_TRUE(GraphWaitsOnHost(module("Scalar", "x * x.sum().item()")));
  EXPECT_FALSE(GraphWaitsOnHost(module("Sorted", "x.index_select(0, torch.argsort(x))")));
  torch::jit::Module outer("Outer");  // in a submodule
  outer.register_module("inner", module("Inner", "torch.nonzero(x)"));
  outer.define("def forward(self, x):\n    return self.inner.forward(x)\n");
  EXPECT_TRUE(GraphWaitsOnHost(outer));
}

// Note [Channels-last convolutions]: the exporter's decoders norm through qpool::group_norm, so
// the kinds lay their weights out channels-last on GPUs.
TEST(Component, TheExportedDecoderNormsThroughTheLayoutKeepingOperator) {
  const std::string repo = testing::TinyRepository();
  if (repo.empty()) GTEST_SKIP() << "the tiny test pipeline is not exported";
  auto decoder = Component::Load("vae_decoder", repo + "/tiny/vae_decoder.pt");
  ASSERT_TRUE(decoder.ok()) << decoder.status().ToString();
  EXPECT_TRUE(GraphCalls((*decoder)->module(), "qpool::group_norm"));
  EXPECT_FALSE(GraphCalls((*decoder)->module(), "aten::group_norm"));
  auto encoder = Component::Load("text_encoder", repo + "/tiny/text_encoder.pt");
  ASSERT_TRUE(encoder.ok()) << encoder.status().ToString();
  EXPECT_FALSE(GraphCalls((*encoder)->module(), "qpool::group_norm"));
}

TEST(Component, MissingFileIsAClearError) {
  auto c = Component::Load("unet", "/nonexistent/unet.pt");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("/nonexistent/unet.pt"), std::string::npos);
}

// Out-of-memory errors reach requests as RESOURCE_EXHAUSTED whichever way LibTorch throws them:
// as a c10::Error, or as the interpreter's std::runtime_error whose last line is the op's error.
TEST(Component, TorchErrorsMapToStatusesWithOneLineMessages) {
  const std::runtime_error interpreter(
      "The following operation failed in the TorchScript interpreter.\n"
      "Traceback of TorchScript (most recent call last):\n  File \"code\", line 3\n"
      "RuntimeError: CUDA out of memory. Tried to allocate 1024.00 MiB.\n");
  Status oom = TorchErrorStatus("pipeline 'p'", interpreter);
  EXPECT_EQ(oom.code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(oom.message(),
            "pipeline 'p': RuntimeError: CUDA out of memory. Tried to allocate 1024.00 MiB.");

  Status shape = TorchErrorStatus("component 'unet' failed",
                                  std::runtime_error("a\nRuntimeError: shapes do not match"));
  EXPECT_EQ(shape.code(), StatusCode::kInternal);
  EXPECT_EQ(shape.message(), "component 'unet' failed: RuntimeError: shapes do not match");

  try {
    TORCH_CHECK(false, "mat1 and mat2 shapes cannot be multiplied");
  } catch (const c10::Error& e) {
    Status s = TorchErrorStatus("c", e);
    EXPECT_EQ(s.code(), StatusCode::kInternal);
    EXPECT_EQ(s.message().find("c: mat1 and mat2 shapes cannot be multiplied"), 0u) << s.message();
  }
}

}  // namespace
}  // namespace qpool
