// The pool on GPUs: replicas of one quantized pipeline on two GPUs serve concurrently, each on
// its own device; under a small memory budget, loads and requests evict idle pipelines to pinned
// host memory, least recently used first. Tests that need two GPUs skip on one.
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <filesystem>
#include <future>
#include <iostream>

#include "gpu/gpu_pipeline_fixture.h"
#include "memory/memory_breakdown.h"
#include "pool/device_pool.h"
#include "pool/pipeline_registry.h"

namespace qpool {
namespace {

const c10::Device kGpu0(c10::kCUDA, 0);
const c10::Device kGpu1(c10::kCUDA, 1);

class PoolGpuTest : public ::testing::Test, protected testing::GpuPipelineTest {
 protected:
  void SetUp() override {
    std::string skip;
    if (!Prepare(&skip)) GTEST_SKIP() << skip;
    auto devices = DevicePool::Create(DevicePoolOptions{"cuda", 64});
    ASSERT_TRUE(devices.ok()) << devices.status().ToString();
    devices_ = std::move(devices).value();
  }
  void TearDown() override {
    if (devices_) devices_->Stop();
  }

  std::unique_ptr<PipelineRegistry> MakeRegistry(AdmissionOptions admission = {}) {
    auto repository = ModelRepository::Open(repo_, kinds_->Catalog());
    EXPECT_TRUE(repository.ok());
    return std::make_unique<PipelineRegistry>(std::move(repository).value(), kinds_, *devices_,
                                              context(), admission);
  }

  // Loads a replica of `name` on `device`, on its worker, as a load of that device plans it.
  StatusOr<LoadResult> LoadOn(PipelineRegistry& registry, const std::string& name,
                              const c10::Device& device) {
    auto plan = registry.PlanLoad(name, device.str());
    if (!plan.ok()) return plan.status();
    return OnWorker(device, [&] { return registry.Load(name, plan->manifest, device); });
  }

  // Runs `work` on `device`'s worker (with its stream current, as requests run) and waits.
  template <typename Work>
  auto OnWorker(const c10::Device& device, Work work) -> decltype(work()) {
    using Result = decltype(work());
    auto done = std::make_shared<std::promise<Result>>();
    auto future = done->get_future();
    Status submitted = devices_->worker(device).Submit([done, &work](bool run) {
      if (!run) return;
      done->set_value(work());
    });
    EXPECT_TRUE(submitted.ok()) << submitted.ToString();
    return future.get();
  }

  static RouteOptions Small() {
    RouteOptions o;
    o.width = 64;
    o.height = 64;
    o.images = 2;
    o.steps = 3;
    return o;
  }

  static uint64_t FileBytes(const std::string& dir) {
    uint64_t total = 0;
    for (const auto& f : std::filesystem::directory_iterator(dir)) {
      if (f.path().extension() == ".pt") total += f.file_size();
    }
    return total;
  }

  const ReplicaStatus* ReplicaOn(PipelineRegistry& registry, const std::string& name,
                                 const std::string& device) {
    statuses_ = registry.ListLoaded();
    for (const auto& p : statuses_) {
      if (p.name != name) continue;
      for (const auto& r : p.replicas) {
        if (r.device == device) return &r;
      }
    }
    return nullptr;
  }

  std::unique_ptr<DevicePool> devices_;
  std::vector<PipelineStatus> statuses_;
};

TEST_F(PoolGpuTest, ReplicasOnTwoGpusServeConcurrentlyEachOnItsDevice) {
  if (torch::cuda::device_count() < 2) GTEST_SKIP() << "needs two GPUs";
  const std::string name = Exported("tiny-nf4") ? "tiny-nf4" : "tiny";
  auto registry = MakeRegistry();
  for (const auto& device : {kGpu0, kGpu1}) {
    auto loaded = LoadOn(*registry, name, device);
    ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  }
  {  // A first run picks kernels and fills caches; outputs are compared from the second run on.
    auto a = registry->Acquire(name, Small());
    auto b = registry->Acquire(name, Small());
    ASSERT_TRUE(a.ok() && b.ok());
    for (auto* lease : {a->get(), b->get()}) {
      auto warm = OnWorker(lease->pipeline().device(),
                           [&] { return lease->pipeline().Generate(Params(), nullptr, nullptr); });
      ASSERT_TRUE(warm.ok()) << warm.status().ToString();
    }
  }
  ASSERT_NE(ReplicaOn(*registry, name, "cuda:0"), nullptr);
  ASSERT_NE(ReplicaOn(*registry, name, "cuda:1"), nullptr);

  // Two requests at once go to the two idle replicas; a third waits behind one of them.
  auto first = registry->Acquire(name, Small());
  auto second = registry->Acquire(name, Small());
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_EQ((*first)->route().reason, "idle");
  EXPECT_EQ((*second)->route().reason, "idle");
  EXPECT_NE((*first)->pipeline().device(), (*second)->pipeline().device());
  {
    auto third = registry->Acquire(name, Small());
    ASSERT_TRUE(third.ok());
    EXPECT_EQ((*third)->route().reason, "least-loaded");
  }

  // Both run at the same time, each on its own worker: no device mismatch anywhere.
  std::vector<std::future<StatusOr<GenerateOutput>>> runs;
  for (auto* lease : {first->get(), second->get()}) {
    auto done = std::make_shared<std::promise<StatusOr<GenerateOutput>>>();
    runs.push_back(done->get_future());
    ASSERT_TRUE(lease->worker()
                    .Submit([done, lease](bool run) {
                      if (run)
                        done->set_value(lease->pipeline().Generate(Params(), nullptr, nullptr));
                    })
                    .ok());
  }
  auto a = runs[0].get();
  auto b = runs[1].get();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  ASSERT_EQ(a->images.size(), 2u);
  ASSERT_EQ(b->images.size(), 2u);
  // Each replica's output under concurrency is the one it gives alone. (Across two GPUs the
  // bytes may differ: kernels may pick other algorithms per device.)
  std::vector<std::pair<PipelineLease*, const GenerateOutput*>> pairs = {{first->get(), &*a},
                                                                         {second->get(), &*b}};
  for (const auto& [lease, concurrent] : pairs) {
    auto alone = OnWorker(lease->pipeline().device(),
                          [&] { return lease->pipeline().Generate(Params(), nullptr, nullptr); });
    ASSERT_TRUE(alone.ok()) << alone.status().ToString();
    for (size_t i = 0; i < alone->images.size(); ++i) {
      EXPECT_TRUE(alone->images[i].png == concurrent->images[i].png)
          << lease->pipeline().device() << " image " << i << " differs from its run alone";
    }
  }
  first->reset();
  second->reset();

  const auto counters = registry->Counters();
  EXPECT_EQ(
      counters.routed.at({name, "cuda:0", "idle"}) + counters.routed.at({name, "cuda:1", "idle"}),
      4u);
  EXPECT_EQ(counters.queued.at(name), 0);
  for (const auto& device : {kGpu0, kGpu1}) {
    auto unloaded = OnWorker(device, [&] { return registry->Unload(name, device); });
    ASSERT_TRUE(unloaded.ok()) << unloaded.status().ToString();
    EXPECT_EQ(unloaded->leaked_bytes, 0u);
  }
  std::cout << "[ pool ] two replicas of " << name
            << " generated concurrently on cuda:0 and cuda:1, each as it does alone" << std::endl;
}

TEST_F(PoolGpuTest, ASmallBudgetEvictsTheLeastRecentlyUsedIdlePipeline) {
  if (!Exported("tiny-nf4") || !Exported("tiny-int8"))
    GTEST_SKIP() << "quantized tiny not exported";
  // The budget holds the larger pipeline's component files and no more: loading it evicts the
  // other one, which is idle.
  std::string small = "tiny-nf4", large = "tiny-int8";
  if (FileBytes(repo_ + "/" + small) > FileBytes(repo_ + "/" + large)) std::swap(small, large);
  const uint64_t budget = FileBytes(repo_ + "/" + large) + 4096;
  const uint64_t total = memory_.Read(kGpu0).total_bytes;
  AdmissionOptions admission;
  admission.memory_budget = static_cast<double>(budget) / static_cast<double>(total);
  admission.default_working_bytes_per_pixel = 16;
  auto registry = MakeRegistry(admission);

  auto loaded = LoadOn(*registry, small, kGpu0);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const uint64_t small_bytes = ReplicaOn(*registry, small, "cuda:0")->device_bytes;
  loaded = LoadOn(*registry, large, kGpu0);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const uint64_t large_bytes = ReplicaOn(*registry, large, "cuda:0")->device_bytes;
  EXPECT_EQ(ReplicaOn(*registry, small, "cuda:0")->residency, "host");
  EXPECT_EQ(ReplicaOn(*registry, small, "cuda:0")->device_bytes, 0u);
  EXPECT_EQ((registry->Counters().evictions.at({small, "cuda:0"})), 1u);

  // A request of the evicted pipeline onloads it, evicting the other if both do not fit.
  auto lease = registry->Acquire(small, Small());
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  EXPECT_EQ((*lease)->route().reason, "onload");
  auto output = OnWorker(kGpu0, [&]() -> StatusOr<GenerateOutput> {
    RETURN_IF_ERROR(registry->Admit(**lease, Small()));
    auto out = (*lease)->pipeline().Generate(Params(), nullptr, nullptr);
    registry->FitGraphs(**lease);  // as the request's end does (RequestRun::End)
    return out;
  });
  ASSERT_TRUE(output.ok()) << output.status().ToString();
  lease->reset();
  const bool both_fit = small_bytes + large_bytes + 16ull * 64 * 64 * 2 <= budget;
  EXPECT_EQ(ReplicaOn(*registry, large, "cuda:0")->residency, both_fit ? "device" : "host");
  EXPECT_EQ(registry->Counters().evictions.count({large, "cuda:0"}), both_fit ? 0u : 1u);
  EXPECT_LE(registry->AttributedBytes()["cuda:0"], budget) << "the budget held throughout";

  // A budget smaller than one pipeline refuses the load with what was needed and what was free.
  AdmissionOptions tiny_budget;
  tiny_budget.memory_budget = 1024.0 / static_cast<double>(total);
  auto refusing = MakeRegistry(tiny_budget);
  auto refused = LoadOn(*refusing, small, kGpu0);
  ASSERT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("budget"), std::string::npos)
      << refused.status().message();
  for (const auto& name : {small, large}) {
    auto unloaded = OnWorker(kGpu0, [&] { return registry->Unload(name, kGpu0); });
    ASSERT_TRUE(unloaded.ok()) << unloaded.status().ToString();
    EXPECT_EQ(unloaded->leaked_bytes, 0u);
  }
  std::cout << "[ pool ] budget " << budget << " bytes on cuda:0: loading " << large << " ("
            << large_bytes << " bytes) evicted " << small << " (" << small_bytes
            << " bytes); its next request onloaded it" << (both_fit ? " next to " : " and evicted ")
            << large << std::endl;
}

// Note [Memory arithmetic]: after a load, requests, an unload and EmptyCache, allocated is the
// sum of its named parts, each part checked against an independent figure (what the unload gave
// back, what EmptyCache released in the driver's figure), and a tensor something still holds at
// the unload is reported as leaked while the workspaces are not.
class MemoryArithmeticGpuTest : public PoolGpuTest {
 protected:
  static constexpr int64_t kSlack = 2 << 20;  // 2 MiB

  MemoryBreakdown Now(PipelineRegistry& registry) {
    c10::cuda::device_synchronize();
    const auto attributed = registry.AttributedBytes();
    auto it = attributed.find("cuda:0");
    stats_ = memory_.Read(kGpu0);
    return BreakDown(stats_, memory_.ReadParts(kGpu0), it == attributed.end() ? 0 : it->second,
                     memory_.ReadDriver(kGpu0));
  }

  // The sums of Note [Memory arithmetic] at rest, to the allocator's rounding.
  void ExpectSumsHold(const MemoryBreakdown& b, const char* when) {
    SCOPED_TRACE(when);
    const auto allocated = static_cast<int64_t>(stats_.allocated_bytes);
    const auto parts =
        static_cast<int64_t>(b.tensor_bytes + b.graph_pool_allocated_bytes + b.workspace_bytes);
    EXPECT_LE(parts, allocated + kSlack) << "named parts exceed allocated: a double count";
    EXPECT_LE(static_cast<int64_t>(b.working_bytes), kSlack) << "allocated at rest, unowned";
    EXPECT_EQ(b.cached_bytes, stats_.reserved_bytes - stats_.allocated_bytes);
    if (b.driver_process_bytes && b.context_bytes) {
      EXPECT_GE(static_cast<int64_t>(*b.driver_process_bytes) + kSlack,
                static_cast<int64_t>(stats_.reserved_bytes + *b.context_bytes))
          << "the driver counts less than reserved + context";
    }
    std::cout << "[ memory ] " << when << ": allocated " << stats_.allocated_bytes << " = tensors "
              << b.tensor_bytes << " + graph pools " << b.graph_pool_allocated_bytes
              << " + workspaces " << b.workspace_bytes << " + working " << b.working_bytes
              << "; reserved " << stats_.reserved_bytes << "; driver "
              << (b.driver_process_bytes ? std::to_string(*b.driver_process_bytes) : "absent")
              << " = reserved + context "
              << (b.context_bytes ? std::to_string(*b.context_bytes) : "absent") << " + outside "
              << (b.outside_bytes ? std::to_string(*b.outside_bytes) : "absent") << std::endl;
  }

  DeviceMemoryStats stats_;
};

TEST_F(MemoryArithmeticGpuTest, EveryAllocatedByteHasANamedOwner) {
  memory_.MeasureContexts({kGpu0});
  const std::string name = "tiny";
  auto registry = MakeRegistry();
  auto loaded = LoadOn(*registry, name, kGpu0);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  ExpectSumsHold(Now(*registry), "after load");
  for (int i = 0; i < 3; ++i) {  // the third replays the graphs the second captured
    auto lease = registry->Acquire(name, Small());
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    auto made =
        OnWorker(kGpu0, [&] { return (*lease)->pipeline().Generate(Params(), nullptr, nullptr); });
    ASSERT_TRUE(made.ok()) << made.status().ToString();
  }
  const MemoryBreakdown served = Now(*registry);
  ExpectSumsHold(served, "after requests");
  EXPECT_GT(served.workspace_bytes, 0u) << "the requests' matrix products made a cuBLAS workspace";
  EXPECT_GT(served.tensor_bytes, 0u);
  const uint64_t allocated_served = stats_.allocated_bytes;

  auto unloaded = OnWorker(kGpu0, [&] { return registry->Unload(name, kGpu0); });
  ASSERT_TRUE(unloaded.ok()) << unloaded.status().ToString();
  EXPECT_EQ(unloaded->leaked_bytes, 0u) << "the workspaces are not the pipeline's";
  const MemoryBreakdown empty = Now(*registry);
  ExpectSumsHold(empty, "after unload");
  EXPECT_EQ(empty.tensor_bytes, 0u);
  EXPECT_EQ(empty.graph_pool_allocated_bytes, 0u);
  EXPECT_EQ(empty.graph_pool_reserved_bytes, 0u);
  // What the unload gave back is what the tensors and graph pools were said to hold.
  EXPECT_NEAR(static_cast<double>(allocated_served - stats_.allocated_bytes),
              static_cast<double>(served.tensor_bytes + served.graph_pool_allocated_bytes), kSlack);
  // And what stays allocated is the workspaces.
  EXPECT_NEAR(static_cast<double>(stats_.allocated_bytes),
              static_cast<double>(empty.workspace_bytes), kSlack);

  // EmptyCache's release shows in the driver's figure, byte for byte: outside stays as it was.
  const uint64_t reserved_before = stats_.reserved_bytes;
  memory_.EmptyCache();
  const MemoryBreakdown released = Now(*registry);
  ExpectSumsHold(released, "after EmptyCache");
  if (empty.driver_process_bytes && released.driver_process_bytes) {
    EXPECT_NEAR(static_cast<double>(*empty.driver_process_bytes - *released.driver_process_bytes),
                static_cast<double>(reserved_before - stats_.reserved_bytes), kSlack);
    ASSERT_TRUE(empty.outside_bytes && released.outside_bytes);
    EXPECT_NEAR(static_cast<double>(*empty.outside_bytes),
                static_cast<double>(*released.outside_bytes), kSlack);
  } else {
    std::cout << "[ memory ] the driver's figures are absent here (no NVML, or it does not list "
                 "this process): their sums were not checked"
              << std::endl;
  }
}

TEST_F(MemoryArithmeticGpuTest, ATensorHeldPastTheUnloadIsALeakAndTheWorkspacesAreNot) {
  const std::string name = "tiny";
  auto registry = MakeRegistry();
  ASSERT_TRUE(LoadOn(*registry, name, kGpu0).ok());
  torch::Tensor held;
  {
    auto lease = registry->Acquire(name, Small());
    ASSERT_TRUE(lease.ok()) << lease.status().ToString();
    auto made =
        OnWorker(kGpu0, [&] { return (*lease)->pipeline().Generate(Params(), nullptr, nullptr); });
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    for (const auto& component : (*lease)->pipeline().components()) {
      for (const auto& t : component->Tensors()) {
        if (t.defined() && t.is_cuda() && (!held.defined() || t.nbytes() > held.nbytes())) held = t;
      }
    }
  }
  ASSERT_TRUE(held.defined());
  auto unloaded = OnWorker(kGpu0, [&] { return registry->Unload(name, kGpu0); });
  ASSERT_TRUE(unloaded.ok()) << unloaded.status().ToString();
  EXPECT_GE(unloaded->leaked_bytes, held.nbytes());
  // Workspaces (tens of MiB) are not counted in: the leak is the held tensor's block.
  EXPECT_LE(unloaded->leaked_bytes, held.storage().nbytes() + kSlack);
  const MemoryBreakdown after = Now(*registry);
  EXPECT_GE(after.working_bytes + kSlack, held.storage().nbytes())
      << "the held block is allocated and no pipeline, graph or library owns it";
  held.reset();
}

}  // namespace
}  // namespace qpool
