// Streaming (the sequential offload policy): components split into groups along their module
// tree, forwards instrumented to bring each group in and send it back, outputs unchanged, every
// request ending with everything on the host, and components that cannot be streamed refused.
// The CPU stands in for the device: groups are copied into working blocks of their own.
#include <gtest/gtest.h>
#include <torch/script.h>

#include "memory/memory_event_log.h"
#include "residency/pipeline_residency.h"
#include "testing/failing_allocator.h"
#include "testing/test_paths.h"

namespace qpool {
namespace {

constexpr int64_t kDim = 8;

// A layer with a parameter, a quant-state buffer and a plain tensor attribute (352 bytes).
torch::jit::Module MakeLayer(float w) {
  torch::jit::Module layer("Layer");
  layer.register_parameter("weight", torch::eye(kDim) * w, /*is_buffer=*/false);
  layer.register_buffer("absmax", torch::full({kDim}, 2.0));
  layer.register_attribute("code", c10::TensorType::get(), torch::linspace(-1, 1, 16));
  layer.define(R"JIT(
    def forward(self, x):
        return torch.matmul(x, self.weight) * self.absmax[0] + self.code[15]
  )JIT");
  return layer;
}

// root (own buffer `scale`) -> stem, body (a container without methods) -> l0, l1, head.
// `cross_read`: the root also reads a tensor of `stem` directly, which streaming cannot allow.
std::unique_ptr<Component> MakeComponent(const std::string& name, bool cross_read = false) {
  torch::jit::Module body("Body");
  body.register_module("l0", MakeLayer(2));
  body.register_module("l1", MakeLayer(3));
  torch::jit::Module root("Root");
  root.register_buffer("scale", torch::full({kDim}, 0.5));
  root.register_module("stem", MakeLayer(1));
  root.register_module("body", body);
  root.register_module("head", MakeLayer(5));
  root.define(cross_read ? R"JIT(
    def forward(self, x):
        return self.head.forward(self.stem.forward(x)) + self.stem.weight[0]
  )JIT"
                         : R"JIT(
    def forward(self, x):
        h = self.stem.forward(x)
        h = self.body.l0.forward(h)
        h = self.body.l1.forward(h)
        return self.head.forward(h) * self.scale[0]
  )JIT");
  const std::string path = testing::MakeTempDir("streaming-" + name) + "/c.pt";
  root.save(path);
  auto c = Component::Load(name, path);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(c).value();
}

using testing::FailingAllocator;

OffloadPolicy Sequential(double group_mib, int prefetch, double resident_mib = 0) {
  auto policy = MakeOffloadPolicy("sequential", 300, {group_mib, prefetch, resident_mib});
  EXPECT_TRUE(policy.ok()) << policy.status().ToString();
  return *policy;
}

struct Fixture {
  Fixture(ArenaAllocator& arenas, OffloadPolicy policy, bool cross_read = false)
      : memory(arenas), component(MakeComponent("c", cross_read)) {
    residency = std::make_unique<PipelineResidency>(
        "p", std::vector<Component*>{component.get()},
        ResidencyContext{&arenas, &copier, &memory, &events}, policy);
  }
  BlockCopier copier;
  DeviceMemory memory;
  MemoryEventLog events;
  std::unique_ptr<Component> component;
  std::unique_ptr<PipelineResidency> residency;
};

torch::Tensor Input() { return torch::arange(2 * kDim, torch::kFloat).reshape({2, kDim}) / 7; }

torch::Tensor Reference() {
  ArenaAllocator arenas;
  Fixture f(arenas, OffloadPolicy{});
  EXPECT_TRUE(f.residency->Place(c10::Device(c10::kCPU), c10::kFloat).ok());
  auto out = f.component->Forward({Input()});
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return *out;
}

// Whether every tensor of the component views its host copy (one block per component).
bool AllOnHostCopy(const Component& c, const ArenaAllocator& arenas) {
  const void* storage = nullptr;
  for (const auto& t : c.Tensors()) {
    if (!t.device().is_cpu()) return false;
    if (storage == nullptr) storage = t.storage().unsafeGetStorageImpl();
    if (t.storage().unsafeGetStorageImpl() != storage) return false;
  }
  return c.Bytes().total() == arenas.cpu_bytes();
}

TEST(StreamPlan, SplitsAlongTheModuleTree) {
  for (double mib : {0.0, 0.0004}) {  // 0: per module with tensors; 0.0004 MiB = 419 bytes
    ArenaAllocator arenas;
    Fixture f(arenas, Sequential(mib, 1));
    ASSERT_TRUE(f.residency->Place(c10::Device(c10::kCPU), c10::kFloat).ok());
    // A layer (352 bytes) fits 419 bytes but the root does not: its own `scale` is a group.
    RequestResidencyScope scope(*f.residency);
    ASSERT_TRUE(f.residency->Use(*f.component).ok());
    ASSERT_TRUE(f.component->Forward({Input()}).ok());
    f.residency->Done(*f.component);
    const auto events = f.events.Recent(1);
    ASSERT_EQ(events.size(), 1u);
    EXPECT_EQ(events[0].kind, MemoryEventKind::kStream);
    // 5 groups (root's own scale, stem, body.l0, body.l1, head), each entered once.
    EXPECT_NE(events[0].message.find("for 5 group runs"), std::string::npos) << events[0].message;
  }
  ArenaAllocator arenas;
  Fixture f(arenas, Sequential(1, 1));  // everything fits one group: the root's subtree
  ASSERT_TRUE(f.residency->Place(c10::Device(c10::kCPU), c10::kFloat).ok());
  RequestResidencyScope scope(*f.residency);
  ASSERT_TRUE(f.residency->Use(*f.component).ok());
  ASSERT_TRUE(f.component->Forward({Input()}).ok());
  f.residency->Done(*f.component);
  EXPECT_NE(f.events.Recent(1)[0].message.find("in 1 copies for 1 group runs"), std::string::npos)
      << f.events.Recent(1)[0].message;
}

TEST(Streaming, GivesTheSameOutputAndEndsOnTheHost) {
  const torch::Tensor expected = Reference();
  ArenaAllocator arenas;
  Fixture f(arenas, Sequential(0, 1));
  ASSERT_TRUE(f.residency->Place(c10::Device(c10::kCPU), c10::kFloat).ok());
  EXPECT_TRUE(AllOnHostCopy(*f.component, arenas));
  EXPECT_EQ(f.residency->Snapshot()[0].state, Residency::kHost);
  const uint64_t host_bytes = arenas.cpu_bytes();
  {
    RequestResidencyScope scope(*f.residency);
    ASSERT_TRUE(f.residency->Use(*f.component).ok());
    EXPECT_EQ(f.residency->Snapshot()[0].state, Residency::kStreaming);
    for (int pass = 0; pass < 3; ++pass) {  // e.g. three denoising steps
      auto out = f.component->Forward({Input()});
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      EXPECT_TRUE(torch::equal(*out, expected)) << "pass " << pass;
    }
    // Between forwards at most the prefetched group is held beside the host copy.
    EXPECT_LE(arenas.cpu_bytes() - host_bytes, 512u);
    f.residency->Done(*f.component);
  }
  EXPECT_EQ(f.residency->Snapshot()[0].state, Residency::kHost);
  EXPECT_TRUE(AllOnHostCopy(*f.component, arenas));
  EXPECT_EQ(arenas.cpu_bytes(), host_bytes);
  const auto events = f.events.Recent(1);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kind, MemoryEventKind::kStream);
  EXPECT_EQ(events[0].outcome, MemoryEventOutcome::kOk);
  EXPECT_NE(events[0].message.find("for 15 group runs"), std::string::npos) << events[0].message;
  // Prefetch 1 holds at most the running layer and the next one (576 bytes each as laid out:
  // 256-byte aligned weight and absmax, then code) besides the root's own 32-byte `scale`, which
  // stays bound while the root's forward runs around them.
  EXPECT_NE(events[0].message.find("at most 1184 bytes"), std::string::npos) << events[0].message;
}

// Groups within resident_mib are copied once per run of the component, not once per forward.
TEST(Streaming, ResidentGroupsStayForTheWholeRun) {
  const torch::Tensor expected = Reference();
  // 0.0012 MiB = 1258 bytes: the root's scale (32), stem and body.l0 (576 each) fit; l1 and
  // head stream at every forward.
  for (const auto& [resident_mib, copies] :
       std::vector<std::pair<double, int>>{{0, 15}, {0.0012, 9}, {1, 5}}) {
    SCOPED_TRACE(resident_mib);
    ArenaAllocator arenas;
    Fixture f(arenas, Sequential(0, 0, resident_mib));
    ASSERT_TRUE(f.residency->Place(c10::Device(c10::kCPU), c10::kFloat).ok());
    const uint64_t host_bytes = arenas.cpu_bytes();
    {
      RequestResidencyScope scope(*f.residency);
      ASSERT_TRUE(f.residency->Use(*f.component).ok());
      for (int pass = 0; pass < 3; ++pass) {
        auto out = f.component->Forward({Input()});
        ASSERT_TRUE(out.ok()) << out.status().ToString();
        EXPECT_TRUE(torch::equal(*out, expected));
      }
    }
    EXPECT_TRUE(AllOnHostCopy(*f.component, arenas));
    EXPECT_EQ(arenas.cpu_bytes(), host_bytes);
    const std::string message = f.events.Recent(1)[0].message;
    EXPECT_NE(message.find(StrCat(" in ", copies, " copies for 15 group runs")), std::string::npos)
        << message;
  }
}

TEST(Streaming, AFailedGroupCopyFailsTheForwardAndLeavesEverythingOnTheHost) {
  FailingAllocator arenas(/*fail_at=*/3, /*count_cpu=*/true);  // the third group's copy
  arenas.armed = false;                                        // not the host copy
  Fixture f(arenas, Sequential(0, 0));
  ASSERT_TRUE(f.residency->Place(c10::Device(c10::kCPU), c10::kFloat).ok());
  arenas.armed = true;
  const uint64_t host_bytes = arenas.cpu_bytes();
  {
    RequestResidencyScope scope(*f.residency);
    ASSERT_TRUE(f.residency->Use(*f.component).ok());
    auto out = f.component->Forward({Input()});
    ASSERT_FALSE(out.ok());
    EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted) << out.status().ToString();
    EXPECT_NE(out.status().message().find("streaming 'body.l0' of component 'c'"),
              std::string::npos)
        << out.status().message();
  }  // the request ends here, failed: Settle brings the component back
  EXPECT_EQ(f.residency->Snapshot()[0].state, Residency::kHost);
  EXPECT_TRUE(AllOnHostCopy(*f.component, arenas));
  EXPECT_EQ(arenas.cpu_bytes(), host_bytes);
}

TEST(Streaming, RefusesAComponentThatReadsAnotherModulesTensor) {
  ArenaAllocator arenas;
  Fixture f(arenas, Sequential(0, 1), /*cross_read=*/true);
  Status placed = f.residency->Place(c10::Device(c10::kCPU), c10::kFloat);
  ASSERT_EQ(placed.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(placed.message().find("component 'c' cannot be streamed: method 'forward' reads a "
                                  "tensor of another module"),
            std::string::npos)
      << placed.message();
  // The same component serves under the model policy.
  ArenaAllocator arenas2;
  OffloadPolicy model;
  model.mode = OffloadMode::kModel;
  Fixture g(arenas2, model, /*cross_read=*/true);
  EXPECT_TRUE(g.residency->Place(c10::Device(c10::kCPU), c10::kFloat).ok());
}

TEST(Streaming, PolicyChangesNeedALoadPlannedForIt) {
  ArenaAllocator arenas;
  Fixture f(arenas, OffloadPolicy{});
  ASSERT_TRUE(f.residency->Place(c10::Device(c10::kCPU), c10::kFloat).ok());
  Status s = f.residency->SetPolicy(Sequential(64, 2));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("set offload.policy: sequential in its manifest"), std::string::npos)
      << s.message();
  // Loaded for streaming: none and back again, the plan's settings kept.
  ArenaAllocator arenas2;
  Fixture g(arenas2, Sequential(0, 1));
  ASSERT_TRUE(g.residency->Place(c10::Device(c10::kCPU), c10::kFloat).ok());
  ASSERT_TRUE(g.residency->SetPolicy(OffloadPolicy{}).ok());
  EXPECT_EQ(g.residency->Snapshot()[0].state, Residency::kDevice);
  ASSERT_TRUE(g.residency->SetPolicy(Sequential(64, 2)).ok());
  EXPECT_EQ(g.residency->Snapshot()[0].state, Residency::kHost);
  EXPECT_EQ(g.residency->policy().stream.group_mib, 0);
  EXPECT_EQ(g.residency->policy().stream.prefetch, 1);
  auto out = g.component->Forward({Input()});  // outside a request: the host copy, no streaming
  ASSERT_TRUE(out.ok());
  EXPECT_TRUE(torch::equal(*out, Reference()));
}

TEST(Streaming, BadSettingsAreRefused) {
  EXPECT_EQ(MakeOffloadPolicy("sequential", 300, {-1, 2, 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeOffloadPolicy("sequential", 300, {64, 17, 0}).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeOffloadPolicy("sequential", 300, {64, 2, -1}).status().code(),
            StatusCode::kInvalidArgument);
  auto group = MakeOffloadPolicy("group", 300);
  EXPECT_EQ(group.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(group.status().message().find("use 'sequential'"), std::string::npos);
  EXPECT_EQ(CheckTransition("unet", Residency::kDevice, c10::Device(c10::kMeta),
                            Residency::kStreaming, c10::Device(c10::kMeta))
                .code(),
            StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace qpool
