// Residency: every tensor of a component (plain attributes and quant state included) moves, moves
// are all or nothing, impossible transitions are refused, requests end in the policy's residency,
// and dropped components give their memory back. The meta device stands in for a second device.
#include <gtest/gtest.h>
#include <torch/script.h>

#include <algorithm>

#include "memory/memory_event_log.h"
#include "residency/pipeline_residency.h"
#include "testing/failing_allocator.h"
#include "testing/test_paths.h"

namespace qpool {
namespace {

// A module with a parameter, an int buffer, quant-state buffers and a plain tensor attribute
// (not a registered buffer: the slot `module.to()` misses) in a submodule.
std::unique_ptr<Component> MakeComponent(const std::string& name) {
  torch::jit::Module inner("Inner");
  inner.register_parameter("weight", torch::ones({4, 4}), /*is_buffer=*/false);
  inner.register_buffer("absmax", torch::full({4}, 2.0));
  inner.register_attribute("code", c10::TensorType::get(), torch::linspace(-1, 1, 16));
  inner.define(R"JIT(
    def forward(self, x):
        return torch.matmul(x, self.weight) * self.absmax[0] + self.code[15]
  )JIT");
  torch::jit::Module outer("Outer");
  outer.register_module("inner", inner);
  outer.register_buffer("position_ids", torch::arange(77, torch::kLong));
  outer.define(R"JIT(
    def forward(self, x):
        return self.inner.forward(x)
  )JIT");
  const std::string path = testing::MakeTempDir("residency-" + name) + "/c.pt";
  outer.save(path);
  auto c = Component::Load(name, path);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

using testing::FailingAllocator;

// `m` saved and loaded back as a component.
std::unique_ptr<Component> Saved(torch::jit::Module& m, const std::string& name) {
  const std::string path = testing::MakeTempDir("residency-" + name) + "/c.pt";
  m.save(path);
  auto c = Component::Load(name, path);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// One component's residency, with everything it needs.
struct Single {
  explicit Single(Component* c)
      : memory(arenas),
        residency("p", {c}, ResidencyContext{&arenas, &copier, &memory, &events}, OffloadPolicy{}) {
  }
  ArenaAllocator arenas;
  BlockCopier copier;
  DeviceMemory memory;
  MemoryEventLog events;
  PipelineResidency residency;
};

struct Fixture {
  explicit Fixture(ArenaAllocator& arenas, OffloadMode mode = OffloadMode::kNone, int n = 2)
      : memory(arenas) {
    for (int i = 0; i < n; ++i) components.push_back(MakeComponent("c" + std::to_string(i)));
    std::vector<Component*> raw;
    for (auto& c : components) raw.push_back(c.get());
    OffloadPolicy policy;
    policy.mode = mode;
    residency = std::make_unique<PipelineResidency>(
        "p", raw, ResidencyContext{&arenas, &copier, &memory, &events}, policy);
  }
  BlockCopier copier;
  DeviceMemory memory;
  MemoryEventLog events;
  std::vector<std::unique_ptr<Component>> components;
  std::unique_ptr<PipelineResidency> residency;
};

TEST(Residency, PlaceConvertsFloatsButKeepsIntsAndQuantState) {
  ArenaAllocator arenas;
  Fixture f(arenas, OffloadMode::kNone, 1);
  ASSERT_TRUE(f.residency->Place(c10::Device(c10::kCPU), c10::kHalf).ok());
  Component& c = *f.components[0];
  auto inner = c.module().attr("inner").toModule();
  EXPECT_EQ(inner.attr("weight").toTensor().scalar_type(), c10::kHalf);
  EXPECT_EQ(inner.attr("absmax").toTensor().scalar_type(), c10::kFloat);  // quant state
  EXPECT_EQ(inner.attr("code").toTensor().scalar_type(), c10::kFloat);    // quant state
  EXPECT_EQ(c.module().attr("position_ids").toTensor().scalar_type(), c10::kLong);
  EXPECT_EQ(c.dtype(), c10::kHalf);
  // One block; each role still counts its own bytes, padding goes to the largest view's role.
  const ComponentBytes b = c.Bytes();
  EXPECT_EQ(b.quant_state, (4u + 16u) * 4);
  EXPECT_EQ(b.weight, 16u * 2);
  EXPECT_EQ(b.total(), arenas.cpu_bytes());
  auto out = c.Forward({torch::ones({2, 4}, torch::kHalf)});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_TRUE(torch::allclose(out->to(torch::kFloat), torch::full({2, 4}, 9.0)));
}

// Note [Tensors that keep their dtype]: a frequency table stays float32 in a float16 component,
// and the embedding computed from it is exact where a float16 table's is not.
TEST(Residency, PlaceKeepsFrequencyTablesInFloat32) {
  torch::jit::Module m("Embed");
  m.register_buffer("freqs", torch::exp(-std::log(10000.0) * torch::arange(8) / 8));
  m.register_buffer("scale", torch::ones({1}));
  m.define(R"JIT(
    def forward(self, t):
        args = t.type_as(self.freqs)[:, None] * self.freqs[None, :]
        return torch.cos(args).type_as(self.scale) * self.scale
  )JIT");
  auto c = Saved(m, "embed");
  ASSERT_NE(c, nullptr);
  Single single(c.get());
  ASSERT_TRUE(single.residency.Place(c10::Device(c10::kCPU), c10::kHalf).ok());
  EXPECT_EQ(c->module().attr("freqs").toTensor().scalar_type(), c10::kFloat);
  EXPECT_EQ(c->module().attr("scale").toTensor().scalar_type(), c10::kHalf);
  EXPECT_TRUE(KeepsSavedDtype("time_proj.freqs"));
  EXPECT_TRUE(KeepsSavedDtype("up.0.proj.absmax"));
  EXPECT_FALSE(KeepsSavedDtype("freqs_scale"));
  EXPECT_FALSE(KeepsSavedDtype("weight"));

  const torch::Tensor t = torch::tensor({999.0f, 1024.0f});
  auto out = c->Forward({t});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->scalar_type(), c10::kHalf);
  const torch::Tensor freqs = c->module().attr("freqs").toTensor();
  const torch::Tensor exact =
      torch::cos(t.index({torch::indexing::Slice(), torch::indexing::None}) *
                 freqs.index({torch::indexing::None}));
  EXPECT_LT((out->to(torch::kFloat) - exact).abs().max().item<float>(), 1e-3);
  // What a float16 table gives for the same timesteps: whole units of phase lost.
  const torch::Tensor half =
      torch::cos((t.index({torch::indexing::Slice(), torch::indexing::None}).to(torch::kHalf) *
                  freqs.to(torch::kHalf).index({torch::indexing::None}))
                     .to(torch::kFloat));
  EXPECT_GT((half - exact).abs().max().item<float>(), 0.05);
}

// Note [Channels-last convolutions]: a component marked channels-last gets its 4-d weights laid
// out channels-last in every place, with the same values, and computes what it computed before.
TEST(Residency, ChannelsLastComponentsKeepTheirLayoutInEveryPlace) {
  torch::jit::Module m("Conv");
  m.register_parameter("weight", torch::randn({8, 3, 3, 3}), /*is_buffer=*/false);
  m.register_parameter("bias", torch::randn({8}), /*is_buffer=*/false);
  m.define(R"JIT(
    def forward(self, x):
        return torch.conv2d(x, self.weight, self.bias, [1, 1], [1, 1])
  )JIT");
  auto c = Saved(m, "conv");
  ASSERT_NE(c, nullptr);
  const torch::Tensor x = torch::randn({2, 3, 16, 16});
  auto before = c->Forward({x});
  ASSERT_TRUE(before.ok());
  const torch::Tensor weight = m.attr("weight").toTensor().clone();
  c->set_weight_memory_format(c10::MemoryFormat::ChannelsLast);

  Single single(c.get());
  PipelineResidency& residency = single.residency;
  ASSERT_TRUE(residency.Place(c10::Device(c10::kCPU), c10::kFloat).ok());
  auto placed = [&] { return c->module().attr("weight").toTensor(); };
  EXPECT_TRUE(placed().is_contiguous(c10::MemoryFormat::ChannelsLast));
  EXPECT_FALSE(placed().is_contiguous());
  EXPECT_TRUE(torch::equal(placed(), weight));
  EXPECT_TRUE(c->module().attr("bias").toTensor().is_contiguous());
  auto after = c->Forward({x});
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(torch::allclose(*after, *before, 1e-5, 1e-5));

  ASSERT_TRUE(residency.MoveTo(c10::Device(c10::kMeta)).ok());
  EXPECT_TRUE(placed().is_meta());
  EXPECT_TRUE(placed().is_contiguous(c10::MemoryFormat::ChannelsLast));
  ASSERT_TRUE(residency.Offload().ok());
  EXPECT_TRUE(placed().is_contiguous(c10::MemoryFormat::ChannelsLast));
  EXPECT_TRUE(torch::equal(placed(), weight));
}

TEST(Residency, MovesEveryTensorIncludingPlainAttributesToTheTarget) {
  ArenaAllocator arenas;
  Fixture f(arenas);
  const c10::Device meta(c10::kMeta);
  ASSERT_TRUE(f.residency->Place(c10::Device(c10::kCPU), c10::kFloat).ok());
  auto report = f.residency->MoveTo(meta);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->moves.size(), 2u);
  for (const auto& move : report->moves) EXPECT_EQ(move.tensors_checked, 4u) << move.component;
  for (const auto& c : f.components) {
    for (const auto& t : c->Tensors()) EXPECT_EQ(t.device(), meta);
    EXPECT_TRUE(c->module().attr("inner").toModule().attr("code").toTensor().is_meta());
  }
  EXPECT_EQ(f.residency->device(), meta);
  for (const auto& place : f.residency->Snapshot()) {
    EXPECT_EQ(place.state, Residency::kDevice);
    EXPECT_EQ(place.device, meta);
  }
  // Back to the host: the host copy is reused (nothing to copy) and every tensor is on the CPU.
  auto back = f.residency->Offload();
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  for (const auto& c : f.components) {
    for (const auto& t : c->Tensors()) EXPECT_TRUE(t.device().is_cpu());
  }
}

TEST(Residency, ALoadUnderNoneGoesStraightToTheDeviceWithNoHostCopy) {
  ArenaAllocator arenas;
  Fixture f(arenas, OffloadMode::kNone, 2);
  const c10::Device meta(c10::kMeta);
  PlaceSeconds seconds;
  Status placed = f.residency->Place(meta, {c10::kHalf, c10::kHalf}, &seconds);
  ASSERT_TRUE(placed.ok()) << placed.ToString();
  EXPECT_EQ(f.residency->device(), meta);
  EXPECT_EQ(arenas.cpu_bytes(), 0u);  // no host block was ever allocated
  EXPECT_EQ(seconds.pack, 0.0);
  for (const auto& c : f.components) {
    for (const auto& t : c->Tensors()) EXPECT_EQ(t.device(), meta);
    auto inner = c->module().attr("inner").toModule();
    EXPECT_EQ(inner.attr("weight").toTensor().scalar_type(), c10::kHalf);
    EXPECT_EQ(inner.attr("absmax").toTensor().scalar_type(), c10::kFloat);  // quant state
    EXPECT_EQ(c->module().attr("position_ids").toTensor().scalar_type(), c10::kLong);
  }
  for (const auto& place : f.residency->Snapshot()) {
    EXPECT_EQ(place.state, Residency::kDevice);
    EXPECT_EQ(place.device, meta);
    EXPECT_EQ(place.host_bytes, 0u);
  }
  const auto events = f.events.Recent(10);
  ASSERT_EQ(events.size(), 2u);
  for (const auto& e : events) {
    EXPECT_EQ(e.kind, MemoryEventKind::kOnload);
    EXPECT_EQ(e.outcome, MemoryEventOutcome::kOk);
    EXPECT_EQ(e.from_device, "host");
    EXPECT_EQ(e.to_device, "meta");
    EXPECT_GT(e.copied_bytes, 0u);
  }
}

TEST(Residency, AFailedLoadStraightToTheDeviceLeavesNothingLoaded) {
  FailingAllocator arenas(/*fail_at=*/2);  // the second component's device block
  Fixture f(arenas, OffloadMode::kNone, 2);
  Status placed = f.residency->Place(c10::Device(c10::kMeta), c10::kFloat);
  ASSERT_FALSE(placed.ok());
  EXPECT_EQ(placed.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(placed.message().find("nothing stays loaded"), std::string::npos) << placed.message();
  for (const auto& place : f.residency->Snapshot()) EXPECT_EQ(place.state, Residency::kUnloaded);
  for (const auto& c : f.components) {
    for (const auto& t : c->Tensors()) EXPECT_FALSE(t.defined());
  }
  EXPECT_EQ(arenas.cpu_bytes(), 0u);
  const auto events = f.events.Recent(10);
  ASSERT_EQ(events.size(), 2u);  // the first component's onload, the second's failure
  EXPECT_EQ(
      std::count_if(events.begin(), events.end(),
                    [](const MemoryEvent& e) { return e.outcome == MemoryEventOutcome::kOk; }),
      1);
}

TEST(Residency, AFailedMoveChangesNothing) {
  FailingAllocator arenas(/*fail_at=*/2);  // the second component's block
  Fixture f(arenas);
  ASSERT_TRUE(f.residency->Place(c10::Device(c10::kCPU), c10::kFloat).ok());
  const uint64_t host_bytes = arenas.cpu_bytes();
  auto moved = f.residency->MoveTo(c10::Device(c10::kMeta));
  ASSERT_FALSE(moved.ok());
  EXPECT_EQ(moved.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(moved.status().message().find("nothing was moved"), std::string::npos)
      << moved.status().message();
  EXPECT_TRUE(f.residency->device().is_cpu());
  for (const auto& c : f.components) {
    for (const auto& t : c->Tensors()) EXPECT_TRUE(t.device().is_cpu());
  }
  EXPECT_EQ(arenas.cpu_bytes(), host_bytes);
  const auto events = f.events.Recent(1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].outcome, MemoryEventOutcome::kError);
}

TEST(Residency, RefusesImpossibleTransitions) {
  const c10::Device cpu(c10::kCPU);
  const c10::Device meta(c10::kMeta);
  Status s = CheckTransition("unet", Residency::kUnloaded, cpu, Residency::kDevice, cpu);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("'unet' cannot go from unloaded to device(cpu)"), std::string::npos)
      << s.message();
  // A load straight to a GPU (meta stands in for one).
  EXPECT_TRUE(CheckTransition("unet", Residency::kUnloaded, cpu, Residency::kDevice, meta).ok());
  EXPECT_TRUE(CheckTransition("unet", Residency::kHost, cpu, Residency::kDevice, meta).ok());
  EXPECT_TRUE(CheckTransition("unet", Residency::kDevice, meta, Residency::kUnloaded, cpu).ok());
  // An unplaced component cannot be staged anywhere.
  ArenaAllocator arenas;
  BlockCopier copier;
  auto c = MakeComponent("c");
  ComponentResidency r(*c, arenas, copier);
  auto staged = r.Stage(Residency::kDevice, meta);
  ASSERT_FALSE(staged.ok());
  EXPECT_EQ(staged.status().code(), StatusCode::kFailedPrecondition);
}

TEST(Residency, ModelPolicyEndsEveryRequestOnTheHost) {
  ArenaAllocator arenas;
  Fixture f(arenas, OffloadMode::kModel);
  ASSERT_TRUE(f.residency->Place(c10::Device(c10::kCPU), c10::kFloat).ok());
  for (const auto& p : f.residency->Snapshot()) EXPECT_EQ(p.state, Residency::kHost);
  {
    // A request that runs the first component only and then fails.
    RequestResidencyScope scope(*f.residency);
    ASSERT_TRUE(f.residency->Use(*f.components[0]).ok());
    f.residency->Prefetch(*f.components[1]);
    EXPECT_EQ(f.residency->Snapshot()[0].state, Residency::kDevice);
    EXPECT_EQ(f.residency->Snapshot()[1].state, Residency::kDevice);  // prefetched
  }
  for (const auto& p : f.residency->Snapshot()) EXPECT_EQ(p.state, Residency::kHost) << p.name;
  // Under `none` the same request leaves everything on the device.
  ASSERT_TRUE(f.residency->SetPolicy(OffloadPolicy{}).ok());
  for (const auto& p : f.residency->Snapshot()) EXPECT_EQ(p.state, Residency::kDevice) << p.name;
}

TEST(Residency, UnloadFreesEveryBlockUnlessSomethingHoldsATensor) {
  ArenaAllocator arenas;
  BlockCopier copier;
  auto c = MakeComponent("c");
  ComponentResidency r(*c, arenas, copier);
  ASSERT_TRUE(r.Place(c10::kFloat, /*pinned=*/false).ok());
  EXPECT_GT(arenas.cpu_bytes(), 0u);
  torch::Tensor retained = c->Tensors()[0];  // e.g. a cache that kept a weight
  auto blocks = r.Blocks();
  ASSERT_EQ(blocks.size(), 1u);
  r.Unload();
  EXPECT_EQ(r.state(), Residency::kUnloaded);
  EXPECT_FALSE(blocks[0].storage.expired());
  EXPECT_EQ(arenas.cpu_bytes(), blocks[0].bytes);
  retained = torch::Tensor();
  EXPECT_TRUE(blocks[0].storage.expired());
  EXPECT_EQ(arenas.cpu_bytes(), 0u);
}

TEST(MemoryEventLog, ResumesFromASequenceAndKeepsTheNewest) {
  MemoryEventLog log(3);
  for (int i = 0; i < 5; ++i) {
    MemoryEvent e;
    e.pipeline = "p" + std::to_string(i);
    EXPECT_EQ(log.Append(e), static_cast<uint64_t>(i + 1));
  }
  EXPECT_EQ(log.last_sequence(), 5u);
  EXPECT_EQ(log.first_available(), 3u);
  auto since = log.Since(3);
  ASSERT_EQ(since.size(), 2u);
  EXPECT_EQ(since[0].sequence, 4u);
  EXPECT_EQ(since[1].pipeline, "p4");
  EXPECT_GT(since[0].unix_nanos, 0);
  EXPECT_FALSE(
      log.WaitFor(5, std::chrono::steady_clock::now() + std::chrono::milliseconds(50), nullptr));
  EXPECT_TRUE(log.WaitFor(4, std::chrono::steady_clock::now(), nullptr));
}

}  // namespace
}  // namespace qpool
