// PipelinePool, the engine's front door, on the CPU without gRPC: its verbs' protocols (load,
// unload, residency changes, policies) and a request's way through it (on-demand load, the
// kind's validation, routing, the worker, progress, cancellation, drain, recording), with a
// fake pipeline kind whose pipelines hold no tensors and can be held mid-run.
#include "pool/pipeline_pool.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>

#include "memory/arena_allocator.h"
#include "residency/block_copy.h"
#include "testing/metric_samples.h"
#include "testing/test_paths.h"

namespace qpool {
namespace {

namespace fs = std::filesystem;
using ::qpool::testing::SampleValue;

// Lets a test hold fake pipelines' runs until it opens the gate.
class Gate {
 public:
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
  }
  void Open() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }
  // Blocks while closed; counts the runs that reached it.
  void Pass() {
    std::unique_lock<std::mutex> lock(mu_);
    ++arrived_;
    cv_.notify_all();
    cv_.wait(lock, [this] { return open_; });
  }
  // Waits until `n` runs have reached the gate.
  void AwaitArrivals(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return arrived_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  int arrived_ = 0;
};

// A pipeline without components: each request "denoises" params.steps steps and returns one
// 1-byte image per requested image.
class FakePipeline final : public Pipeline {
 public:
  FakePipeline(const PipelineKind& kind, const PipelineManifest& manifest, Gate& gate)
      : Pipeline(kind, manifest, c10::kFloat), gate_(gate) {}
  Status Place(const c10::Device& device, const ResidencyContext& residency) {
    return LoadComponents(device, residency);
  }

  void GenerateBatch(std::vector<BatchItem> items) override {
    gate_.Pass();
    for (auto& item : items) {
      const GenerateParams& p = *item.params;
      bool stopped = false;
      for (int step = 1; step <= p.steps && !stopped; ++step) {
        if (item.cancelled && item.cancelled()) stopped = true;
        if (!stopped && item.progress) item.progress(step, p.steps);
      }
      if (stopped) {
        item.done(Cancelled("request cancelled by the client"));
        continue;
      }
      GenerateOutput out;
      for (int i = 0; i < p.num_images; ++i) out.images.push_back({"x", p.width, p.height});
      out.batch_size = static_cast<int>(items.size());
      item.done(std::move(out));
    }
  }
  StatusOr<EncodeOutput> Encode(const std::vector<std::string>& prompts) override {
    gate_.Pass();
    EncodeOutput out;
    out.input_ids = torch::zeros({static_cast<int64_t>(prompts.size()), 4}, torch::kLong);
    out.embeddings = torch::ones({static_cast<int64_t>(prompts.size()), 4, 8});
    return out;
  }

 private:
  Gate& gate_;
};

// Kind "fake": no components; refuses prompts that contain "refuse" (the kind's validation).
class FakeKind final : public PipelineKind {
 public:
  explicit FakeKind(Gate& gate) : gate_(gate) {}
  const std::string& name() const override { return name_; }
  const std::vector<ComponentDecl>& components() const override { return components_; }
  double default_working_bytes_per_pixel() const override { return 1; }
  StatusOr<GenerateParams> ResolveGenerate(const GenerateRequestIn& in,
                                           const PipelineManifest& manifest) const override {
    if (in.prompt.find("refuse") != std::string::npos) {
      return InvalidArgument("the fake kind refuses this prompt");
    }
    return PipelineKind::ResolveGenerate(in, manifest);
  }
  StatusOr<std::unique_ptr<Pipeline>> Load(const PipelineManifest& manifest,
                                           const c10::Device& device, c10::ScalarType dtype,
                                           const ResidencyContext& residency) const override {
    gate_.Pass();
    auto pipeline = std::make_unique<FakePipeline>(*this, manifest, gate_);
    RETURN_IF_ERROR(pipeline->Place(device, residency));
    return std::unique_ptr<Pipeline>(std::move(pipeline));
  }

 private:
  Gate& gate_;
  const std::string name_ = "fake";
  const std::vector<ComponentDecl> components_;
};

// Records what the pool tells a Generate call.
class Listener final : public GenerateListener {
 public:
  void OnProgress(int step, int total, double elapsed_seconds) override {
    std::lock_guard<std::mutex> lock(mu_);
    steps_.push_back(step);
  }
  bool Cancelled() const override { return cancelled_.load(); }
  void OnReply(StatusOr<GenerateReply> reply) override { reply_.set_value(std::move(reply)); }

  StatusOr<GenerateReply> Wait() { return future_.get(); }
  std::vector<int> steps() {
    std::lock_guard<std::mutex> lock(mu_);
    return steps_;
  }
  std::atomic<bool> cancelled_{false};

 private:
  std::mutex mu_;
  std::vector<int> steps_;
  std::promise<StatusOr<GenerateReply>> reply_;
  std::future<StatusOr<GenerateReply>> future_ = reply_.get_future();
};

class EncodeWaiter final : public EncodeListener {
 public:
  void OnReply(StatusOr<EncodeReply> reply) override { reply_.set_value(std::move(reply)); }
  StatusOr<EncodeReply> Wait() { return reply_.get_future().get(); }

 private:
  std::promise<StatusOr<EncodeReply>> reply_;
};

// Waits for a verb's `done`.
template <typename T>
class Result {
 public:
  PipelinePool::Done<T> callback() {
    return [this](StatusOr<T> result) { promise_.set_value(std::move(result)); };
  }
  StatusOr<T> Get() { return promise_.get_future().get(); }

 private:
  std::promise<StatusOr<T>> promise_;
};

class PipelinePoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testing::MakeTempDir("pipeline_pool_test");
    WriteManifest("alpha", "");
    WriteManifest("beta", "limits: {max_queue: 1}\n");
    auto devices = DevicePool::Create({"cpu", 16});
    ASSERT_TRUE(devices.ok()) << devices.status().ToString();
    devices_ = std::move(devices).value();
  }
  void TearDown() override {
    gate_.Open();
    pool_.reset();
    devices_->Stop();
    testing::RemoveTree(root_);
  }

  void WriteManifest(const std::string& name, const std::string& extra) {
    const fs::path dir = fs::path(root_) / name;
    fs::create_directories(dir);
    std::ofstream(dir / "vocab.json") << "{}";
    std::ofstream(dir / "merges.txt") << "#version: 0.2\n";
    std::ofstream(dir / "pipeline.yaml")
        << "kind: fake\ncomponents: {}\ntokenizer: {vocab: vocab.json, merges: merges.txt}\n"
        << "defaults: {steps: 3, width: 64, height: 64}\n"
        << extra;
  }

  PipelinePool& Pool(PoolOptions options = {}) {
    std::vector<std::unique_ptr<PipelineKind>> kinds;
    kinds.push_back(std::make_unique<FakeKind>(gate_));
    auto catalog_kinds = std::make_shared<const PipelineKinds>(std::move(kinds));
    auto repository = ModelRepository::Open(root_, catalog_kinds->Catalog());
    EXPECT_TRUE(repository.ok()) << repository.status().ToString();
    pool_ = std::make_unique<PipelinePool>(std::move(repository).value(), catalog_kinds, *devices_,
                                           context(), &metrics_, options);
    return *pool_;
  }

  StatusOr<LoadResult> Load(const std::string& name) {
    Result<LoadResult> result;
    pool_->Load(name, "", result.callback());
    return result.Get();
  }
  StatusOr<UnloadResult> Unload(const std::string& name) {
    Result<UnloadResult> result;
    pool_->Unload(name, result.callback());
    return result.Get();
  }
  static GenerateCall Call(const std::string& pipeline, const std::string& prompt = "a fox") {
    GenerateCall call;
    call.pipeline = pipeline;
    call.request.prompt = prompt;
    return call;
  }
  const PipelineStatus* Find(const std::vector<PipelineStatus>& list, const std::string& name) {
    for (const auto& p : list) {
      if (p.name == name) return &p;
    }
    return nullptr;
  }
  ResidencyContext context() { return ResidencyContext{&arenas_, &copier_, &memory_, &events_}; }

  std::string root_;
  Gate gate_;
  ArenaAllocator arenas_;
  BlockCopier copier_;
  DeviceMemory memory_{arenas_};
  MemoryEventLog events_;
  MetricsRegistry metrics_;
  std::unique_ptr<DevicePool> devices_;
  std::unique_ptr<PipelinePool> pool_;
};

TEST_F(PipelinePoolTest, LoadListAndUnloadAPipeline) {
  PipelinePool& pool = Pool();
  const auto before = pool.List();
  ASSERT_EQ(before.size(), 2u);
  ASSERT_NE(Find(before, "alpha"), nullptr);
  EXPECT_EQ(Find(before, "alpha")->state, PipelineState::kAvailable);
  EXPECT_EQ(Find(before, "alpha")->kind, "fake");

  auto loaded = Load("alpha");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_FALSE(loaded->already_loaded);
  EXPECT_EQ(loaded->pipeline.state, PipelineState::kLoaded);
  EXPECT_EQ(loaded->pipeline.device, "cpu");
  ASSERT_EQ(loaded->pipeline.replicas.size(), 1u);
  auto again = Load("alpha");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->already_loaded);
  EXPECT_EQ(again->pipeline.name, "alpha");

  EXPECT_EQ(Find(pool.List(), "alpha")->state, PipelineState::kLoaded);
  const MemoryReport report = pool.Memory(16);
  ASSERT_EQ(report.pipelines.size(), 1u);
  EXPECT_EQ(report.pipelines[0].name, "alpha");
  ASSERT_FALSE(report.devices.empty());
  EXPECT_EQ(report.devices[0].stats.device, "cpu");
  EXPECT_EQ(report.leaked_bytes_total, 0u);
  bool load_event = false;
  for (const auto& e : report.events) load_event |= e.kind == MemoryEventKind::kLoad;
  EXPECT_TRUE(load_event);

  auto unloaded = Unload("alpha");
  ASSERT_TRUE(unloaded.ok()) << unloaded.status().ToString();
  EXPECT_EQ(unloaded->leaked_bytes, 0u);
  EXPECT_EQ(Find(pool.List(), "alpha")->state, PipelineState::kAvailable);
  EXPECT_EQ(Unload("alpha").status().code(), StatusCode::kFailedPrecondition);
}

// The second of two concurrent loads runs after the first on the device's worker and finds the
// replica there: already_loaded (the gRPC layer once answered false to both).
TEST_F(PipelinePoolTest, ConcurrentLoadsOfOnePipelineReportWhichOneLoadedIt) {
  Pool();
  gate_.Close();
  Result<LoadResult> first, second;
  pool_->Load("alpha", "", first.callback());
  gate_.AwaitArrivals(1);  // the first load runs, held in the kind's Load
  pool_->Load("alpha", "", second.callback());
  gate_.Open();
  auto a = first.Get();
  auto b = second.Get();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_FALSE(a->already_loaded);
  EXPECT_TRUE(b->already_loaded);
  EXPECT_EQ(b->pipeline.state, PipelineState::kLoaded);
  EXPECT_EQ(b->pipeline.replicas.size(), 1u);
}

TEST_F(PipelinePoolTest, VerbsRefuseBadAndUnknownNames) {
  Pool();
  EXPECT_EQ(Load("../etc").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(Load("nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(Unload("nope").status().code(), StatusCode::kNotFound);
  Result<ChangeResult> offload;
  pool_->ChangeResidency("nope", ResidencyChange::kOffload, "", offload.callback());
  EXPECT_EQ(offload.Get().status().code(), StatusCode::kNotFound);
  Result<PipelineStatus> policy;
  pool_->SetPolicy("alpha", OffloadPolicy{}, policy.callback());
  EXPECT_EQ(policy.Get().status().code(), StatusCode::kFailedPrecondition);  // not loaded
}

TEST_F(PipelinePoolTest, AGenerateCallIsResolvedByItsKindRunOnTheWorkerAndRecorded) {
  Pool();
  ASSERT_TRUE(Load("alpha").ok());
  Listener listener;
  pool_->Generate(Call("alpha"), &listener);
  auto reply = listener.Wait();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->params.steps, 3);  // the manifest's default
  EXPECT_EQ(reply->params.width, 64);
  ASSERT_EQ(reply->images.size(), 1u);
  EXPECT_EQ(reply->run.device, "cpu");
  EXPECT_EQ(reply->run.attempts, 1);
  EXPECT_FALSE(reply->run.route.empty());
  EXPECT_GE(reply->run.total_seconds, reply->run.queue_seconds);
  EXPECT_EQ(listener.steps(), (std::vector<int>{1, 2, 3}));
  EXPECT_EQ(SampleValue(metrics_, "qpool_requests_total",
                        {{"pipeline", "alpha"}, {"rpc", "generate"}, {"status", "OK"}}),
            1);

  // The kind's own validation answers before anything is queued.
  Listener refused;
  pool_->Generate(Call("alpha", "please refuse"), &refused);
  EXPECT_EQ(refused.Wait().status().code(), StatusCode::kInvalidArgument);
  // ... and so do the manifest's limits, through the kind's default resolution.
  Listener too_many;
  GenerateCall call = Call("alpha");
  call.request.steps = 100000;
  pool_->Generate(call, &too_many);
  EXPECT_EQ(too_many.Wait().status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(
      SampleValue(metrics_, "qpool_requests_total",
                  {{"pipeline", "alpha"}, {"rpc", "generate"}, {"status", "INVALID_ARGUMENT"}}),
      2);
}

TEST_F(PipelinePoolTest, RequestsForPipelinesNotServedAreRefusedWithTheirStatus) {
  Pool();
  Listener unknown, bad, not_loaded;
  pool_->Generate(Call("nope"), &unknown);
  pool_->Generate(Call("a/b"), &bad);
  pool_->Generate(Call("alpha"), &not_loaded);
  EXPECT_EQ(unknown.Wait().status().code(), StatusCode::kNotFound);
  EXPECT_EQ(bad.Wait().status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(not_loaded.Wait().status().code(), StatusCode::kFailedPrecondition);
  // Names the repository does not hold never become labels.
  EXPECT_EQ(SampleValue(metrics_, "qpool_requests_total",
                        {{"pipeline", "unknown"}, {"rpc", "generate"}, {"status", "NOT_FOUND"}}),
            1);
}

TEST_F(PipelinePoolTest, LoadOnDemandLoadsThePipelineForTheRequest) {
  PoolOptions options;
  options.load_on_demand = true;
  Pool(options);
  Listener listener;
  pool_->Generate(Call("alpha"), &listener);
  auto reply = listener.Wait();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(Find(pool_->List(), "alpha")->state, PipelineState::kLoaded);
}

TEST_F(PipelinePoolTest, UnloadWaitsForNoRequestInFlightAndTheQueueIsBounded) {
  Pool();
  ASSERT_TRUE(Load("beta").ok());  // limits.max_queue 1
  gate_.Close();
  Listener running;
  pool_->Generate(Call("beta"), &running);
  gate_.AwaitArrivals(1);
  EXPECT_EQ(pool_->InFlight(), 1);
  // One request queued or running is beta's limit.
  Listener over;
  pool_->Generate(Call("beta"), &over);
  EXPECT_EQ(over.Wait().status().code(), StatusCode::kResourceExhausted);
  // No unload under a running request.
  auto busy = Unload("beta");
  EXPECT_EQ(busy.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(busy.status().message().find("in flight"), std::string::npos);
  // A move to where it is answers at once, without waiting for the running request (it waited
  // for it, then for the queue, before).
  Result<ChangeResult> stay;
  pool_->ChangeResidency("beta", ResidencyChange::kMove, "cpu", stay.callback());
  auto stayed = stay.Get();
  ASSERT_TRUE(stayed.ok()) << stayed.status().ToString();
  EXPECT_TRUE(stayed->report.moves.empty());
  gate_.Open();
  ASSERT_TRUE(running.Wait().ok());
  EXPECT_EQ(pool_->InFlight(), 0);
  EXPECT_TRUE(Unload("beta").ok());
}

TEST_F(PipelinePoolTest, ACancelledCallStopsAtAStepAndADrainingPoolRefusesNewCalls) {
  Pool();
  ASSERT_TRUE(Load("alpha").ok());
  Listener cancelled;
  cancelled.cancelled_ = true;
  pool_->Generate(Call("alpha"), &cancelled);
  EXPECT_EQ(cancelled.Wait().status().code(), StatusCode::kCancelled);

  pool_->BeginDrain();
  EXPECT_TRUE(pool_->draining());
  Listener late;
  pool_->Generate(Call("alpha"), &late);
  auto refused = late.Wait();
  EXPECT_EQ(refused.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(refused.status().message().find("draining"), std::string::npos);
  EncodeWaiter encode;
  pool_->Encode(EncodeCall{"alpha", {"a fox"}, {}}, &encode);
  EXPECT_EQ(encode.Wait().status().code(), StatusCode::kUnavailable);
}

TEST_F(PipelinePoolTest, EncodeValidatesThePromptCountAndAnswersFromTheWorker) {
  Pool();
  ASSERT_TRUE(Load("alpha").ok());
  EncodeWaiter ok;
  EncodeCall call{"alpha", {"a", "b"}, std::chrono::system_clock::time_point::max()};
  pool_->Encode(call, &ok);
  auto reply = ok.Wait();
  ASSERT_TRUE(reply.ok()) << reply.status().ToString();
  EXPECT_EQ(reply->output.embeddings.size(0), 2);
  EXPECT_EQ(reply->run.device, "cpu");
  EncodeWaiter too_many;
  call.prompts.assign(1000, "x");
  pool_->Encode(call, &too_many);
  EXPECT_EQ(too_many.Wait().status().code(), StatusCode::kInvalidArgument);
}

TEST_F(PipelinePoolTest, ResidencyChangesAndPoliciesGoThroughTheFrontDoor) {
  Pool();
  ASSERT_TRUE(Load("alpha").ok());
  // A CPU pipeline has nothing to offload.
  Result<ChangeResult> offload;
  pool_->ChangeResidency("alpha", ResidencyChange::kOffload, "", offload.callback());
  EXPECT_EQ(offload.Get().status().code(), StatusCode::kFailedPrecondition);
  Result<ChangeResult> move;
  pool_->ChangeResidency("alpha", ResidencyChange::kMove, "", move.callback());
  EXPECT_EQ(move.Get().status().code(), StatusCode::kInvalidArgument);  // no target

  auto idle = MakeOffloadPolicy("idle", 60);
  ASSERT_TRUE(idle.ok());
  Result<PipelineStatus> set;
  pool_->SetPolicy("alpha", *idle, set.callback());
  auto status = set.Get();
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_EQ(status->policy.mode, OffloadMode::kIdle);
  EXPECT_EQ(status->policy.idle_seconds, 60);
}

TEST_F(PipelinePoolTest, StartUpLoadsAndUnloadAllLeaveNothingLoaded) {
  Pool();
  pool_->LoadAtStartup({"all"});
  for (const auto& p : pool_->List()) EXPECT_EQ(p.state, PipelineState::kLoaded) << p.name;
  pool_->UnloadAll();
  for (const auto& p : pool_->List()) EXPECT_EQ(p.state, PipelineState::kAvailable) << p.name;
  EXPECT_EQ(pool_->Memory(0).leaked_bytes_total, 0u);
}

TEST_F(PipelinePoolTest, EmptyCacheNamesADeviceNotServed) {
  Pool();
  auto released = pool_->EmptyCache("");
  ASSERT_TRUE(released.ok()) << released.status().ToString();
  EXPECT_EQ(released->before.size(), released->after.size());
  EXPECT_EQ(pool_->EmptyCache("cuda:7").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace qpool
