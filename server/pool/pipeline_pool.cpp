#include "pool/pipeline_pool.h"

#include <ATen/Context.h>
#if QPOOL_WITH_CUDA
#include <torch/csrc/cuda/memory_snapshot.h>
#endif

#include <algorithm>
#include <future>
#include <map>
#include <mutex>
#include <set>

#include "pool/encode_run.h"
#include "pool/generate_run.h"
#include "pool/idle_offloader.h"
#include "pool/pipeline_loader.h"
#include "pool/pipeline_registry.h"
#include "pool/pool_metrics.h"
#include "pool/request_metrics.h"
#include "util/clock.h"
#include "util/log.h"

namespace qpool {

PipelinePool::PipelinePool(ModelRepository repository, std::shared_ptr<const PipelineKinds> kinds,
                           DevicePool& devices, ResidencyContext residency,
                           MetricsRegistry* metrics, PoolOptions options)
    : devices_(devices),
      residency_(residency),
      registry_(std::make_unique<PipelineRegistry>(std::move(repository), std::move(kinds), devices,
                                                   residency, options.admission)),
      loader_(std::make_unique<OnDemandLoader>(*registry_, devices)),
      load_on_demand_(options.load_on_demand),
      memory_budget_(options.admission.memory_budget) {
  registry_->SetScaleOut([this](const std::string& name, const c10::Device& device) {
    loader_->AddReplica(name, device);
  });
  if (metrics != nullptr) {
    requests_ = std::make_unique<RequestMetrics>(*metrics);
    metrics_ = std::make_unique<PoolMetrics>(*metrics, *registry_, devices, *requests_);
  }
  idle_ = std::make_unique<IdleOffloader>(*registry_, devices, options.idle_check_period);
}

PipelinePool::~PipelinePool() {
  idle_->Stop();
  registry_->SetScaleOut(nullptr);
}

RequestContext PipelinePool::Context() {
  return RequestContext{
      registry_.get(), &draining_,        load_on_demand_ ? loader_.get() : nullptr,
      requests_.get(), residency_.memory, residency_.events};
}

void PipelinePool::Load(const std::string& name, const std::string& device, Done<LoadResult> done) {
  auto planned = registry_->PlanLoad(name, device);
  if (!planned.ok()) {
    done(planned.status());
    return;
  }
  if (planned->devices.empty()) {  // loaded already, where it was asked for
    LoadResult result;
    result.already_loaded = true;
    if (auto status = registry_->LoadedStatus(name)) result.pipeline = *status;
    done(std::move(result));
    return;
  }
  // One replica per device, each loaded on its own worker; the result is the last replica's
  // status, with every replica's load time and stages summed (Note [Load stages]).
  auto result = std::make_shared<LoadResult>();
  LoadReplicas(
      *registry_, devices_, name, std::move(planned).value(),
      [result](const LoadResult& loaded) {
        const double seconds = result->load_seconds + loaded.load_seconds;
        LoadStages stages = result->stages;
        stages += loaded.stages;
        *result = loaded;
        result->load_seconds = seconds;
        result->stages = stages;
      },
      [result, done = std::move(done)](const Status& status) {
        if (!status.ok()) {
          done(status);
        } else {
          done(std::move(*result));
        }
      });
}

void PipelinePool::Unload(const std::string& name, Done<UnloadResult> done) {
  // Each replica unloads on its device's worker: its frees are ordered after its last request
  // and nothing else allocates there during the leak check (Note [Leak check]).
  auto devices = registry_->BeginUnload(name);
  if (!devices.ok()) {
    done(devices.status());
    return;
  }
  auto total = std::make_shared<UnloadResult>();
  InTurn(
      std::move(devices).value(),
      [this, name, total](const c10::Device& device) -> Status {
        ASSIGN_OR_RETURN(UnloadResult result, registry_->Unload(name, device));
        total->freed_bytes += result.freed_bytes;
        total->leaked_bytes += result.leaked_bytes;
        return Status::Ok();
      },
      [this, name, total, done = std::move(done)](const Status& status) {
        registry_->EndUnload(name);
        if (!status.ok()) {
          done(status);
        } else {
          done(std::move(*total));
        }
      });
}

void PipelinePool::ChangeResidency(const std::string& name, ResidencyChange change,
                                   const std::string& device, Done<ChangeResult> done) {
  auto plan = registry_->PlanChange(name, change, device);
  if (!plan.ok()) {
    done(plan.status());
    return;
  }
  // Each replica changes on the worker of its target device, one after the other.
  auto replicas = std::make_shared<std::map<std::string, c10::Device>>();  // target -> replica
  std::vector<c10::Device> targets;
  for (const auto& [replica, target] : *plan) {
    replicas->emplace(target.str(), replica);
    targets.push_back(target);
  }
  auto result = std::make_shared<ChangeResult>();
  InTurn(
      std::move(targets),
      [this, name, change, replicas, result](const c10::Device& target) -> Status {
        ASSIGN_OR_RETURN(
            ResidencyReport report,
            registry_->ChangeResidency(name, replicas->at(target.str()), change, target));
        for (auto& move : report.moves) result->report.moves.push_back(std::move(move));
        result->report.bytes += report.bytes;
        result->report.seconds += report.seconds;
        return Status::Ok();
      },
      [this, name, result, done = std::move(done)](const Status& status) {
        if (!status.ok()) {
          done(status);
          return;
        }
        if (auto loaded = registry_->LoadedStatus(name)) result->pipeline = *loaded;
        done(std::move(*result));
      });
}

void PipelinePool::SetPolicy(const std::string& name, const OffloadPolicy& policy,
                             Done<PipelineStatus> done) {
  auto plan = registry_->PlanChange(name, ResidencyChange::kOffload, "");
  if (!plan.ok()) {
    done(plan.status());
    return;
  }
  std::vector<c10::Device> replicas;
  for (const auto& [replica, target] : *plan) replicas.push_back(replica);
  InTurn(
      std::move(replicas),
      [this, name, policy](const c10::Device& device) {
        return registry_->SetPolicy(name, device, policy);
      },
      [this, name, done = std::move(done)](const Status& status) {
        if (!status.ok()) {
          done(status);
          return;
        }
        auto loaded = registry_->LoadedStatus(name);
        done(loaded ? std::move(*loaded) : PipelineStatus{});
      });
}

void PipelinePool::Generate(GenerateCall call, GenerateListener* listener) {
  GenerateRun::Begin(Context(), std::move(call), listener);
}

void PipelinePool::Encode(EncodeCall call, EncodeListener* listener) {
  EncodeRun::Begin(Context(), std::move(call), listener);
}

void PipelinePool::CountRefused(RequestRpc rpc, const Status& status) {
  if (requests_ != nullptr) {
    requests_->RecordFinished(RequestMetrics::kUnknownPipeline, rpc, status.code(), 0.0);
  }
}

std::vector<PipelineStatus> PipelinePool::List() { return registry_->List(); }

MemoryReport PipelinePool::Memory(size_t max_events) {
  MemoryReport report;
  const auto attributed = registry_->AttributedBytes();
  if (residency_.memory != nullptr) {
    for (auto& stats : residency_.memory->ReadAll(devices_.devices())) {
      MemoryReport::Device d;
      auto it = attributed.find(stats.device);
      d.pipeline_bytes = it == attributed.end() ? 0 : it->second;
      const c10::Device device(stats.device);
      if (device.is_cuda()) {
        const DeviceMemory& memory = *residency_.memory;
        d.breakdown =
            BreakDown(stats, memory.ReadParts(device), d.pipeline_bytes, memory.ReadDriver(device));
      }
      d.stats = std::move(stats);
      report.devices.push_back(std::move(d));
    }
    report.pinned_host_bytes = residency_.memory->pinned_bytes();
  }
  report.pipelines = registry_->ListLoaded();
  report.leaked_bytes_total = registry_->leaked_bytes_total();
  if (residency_.events != nullptr) {
    report.first_event_available = residency_.events->first_available();
    report.events = residency_.events->Recent(max_events);
    report.last_sequence = residency_.events->last_sequence();
  }
  return report;
}

StatusOr<EmptyCacheResult> PipelinePool::EmptyCache(const std::string& device) {
  std::vector<c10::Device> devices;
  for (const auto& d : devices_.devices()) {
    if (device.empty() || d.str() == device) devices.push_back(d);
  }
  if (devices.empty()) {
    return InvalidArgument(StrCat("device '", device, "' is not served here"));
  }
  if (residency_.memory == nullptr) return EmptyCacheResult{};
  const auto start = std::chrono::steady_clock::now();
  EmptyCacheResult result;
  result.before = residency_.memory->ReadAll(devices);
  residency_.memory->EmptyCache();
  result.after = residency_.memory->ReadAll(devices);
  const double seconds = SecondsSince(start);
  for (size_t i = 0; i < devices.size(); ++i) {
    const DeviceMemoryStats& before = result.before[i];
    const DeviceMemoryStats& after = result.after[i];
    if (before.reserved_bytes > after.reserved_bytes) {
      result.released_bytes += before.reserved_bytes - after.reserved_bytes;
    }
    if (!devices[i].is_cuda() || residency_.events == nullptr) continue;
    MemoryEvent e;
    e.kind = MemoryEventKind::kEmptyCache;
    e.device = devices[i].str();
    e.allocated_before = before.allocated_bytes;
    e.allocated_after = after.allocated_bytes;
    e.reserved_before = before.reserved_bytes;
    e.reserved_after = after.reserved_bytes;
    e.duration_seconds = seconds;
    residency_.events->Append(std::move(e));
  }
  return result;
}

StatusOr<std::string> PipelinePool::AllocatorSnapshot() {
  if (!at::globalContext().hasCUDA()) {
    return FailedPrecondition("no CUDA device: the allocator snapshot covers GPUs only");
  }
#if QPOOL_WITH_CUDA
  try {
    return torch::cuda::_memory_snapshot_pickled();
  } catch (const c10::Error& e) {
    return Internal(StrCat("allocator snapshot failed: ", e.what_without_backtrace()));
  }
#else
  return FailedPrecondition("this server was built without CUDA");
#endif
}

void PipelinePool::LoadAtStartup(const std::vector<std::string>& requested,
                                 const std::function<bool()>& stop) {
  std::vector<std::string> names = requested;
  if (names.size() == 1 && names[0] == "all") names = registry_->RepositoryNames();
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& name = names[i];
    if (stop && stop()) {
      log::Warn("start-up loads stopped: ", names.size() - i, " pipeline(s) not loaded");
      return;
    }
    std::promise<void> loaded;
    Load(name, "", [&](StatusOr<LoadResult> result) {
      if (!result.ok()) {
        log::Error("cannot load '", name, "' at start-up: ", result.status().message());
      }
      loaded.set_value();
    });
    loaded.get_future().wait();
  }
}

int PipelinePool::InFlight() {
  int n = 0;
  for (const auto& [name, queued] : registry_->Counters().queued) n += queued;
  return n;
}

PoolLoad PipelinePool::CurrentLoad() {
  PoolLoad load;
  load.draining = draining_.load();
  std::set<std::string> serving;  // devices with a replica
  for (const auto& pipeline : registry_->ListLoaded()) {
    ++load.loaded_pipelines;
    load.in_flight += static_cast<int>(pipeline.in_flight);
    load.queue_capacity += pipeline.max_queue;
    bool resident = false;
    for (const auto& replica : pipeline.replicas) {
      serving.insert(replica.device);
      resident = resident || replica.residency == "device";
    }
    if (resident) ++load.resident_pipelines;
  }
  load.serving_devices = std::max<size_t>(1, serving.size());
  for (const auto& device : devices_.devices()) {
    if (serving.count(device.str()) != 0) load.device_tasks += devices_.worker(device).pending();
    if (!device.is_cuda() || residency_.memory == nullptr) continue;
    const DeviceMemoryStats stats = residency_.memory->Read(device);
    load.budget_bytes +=
        static_cast<uint64_t>(memory_budget_ * static_cast<double>(stats.total_bytes));
    load.allocated_bytes += stats.allocated_bytes;
  }
  return load;
}

void PipelinePool::UnloadAll() {
  idle_->Stop();
  std::vector<std::string> unloaded;
  for (const auto& pipeline : registry_->ListLoaded()) {
    const std::string& name = pipeline.name;
    std::promise<Status> done;
    Unload(name, [&](StatusOr<UnloadResult> result) { done.set_value(result.status()); });
    const Status status = done.get_future().get();  // Unload logs each replica's result
    if (status.ok()) {
      unloaded.push_back(name);
    } else {
      log::Warn("unloading '", name, "' at exit failed: ", status.message());
    }
  }
  std::string names;
  for (const auto& name : unloaded) names += (names.empty() ? "" : ", ") + name;
  log::Info("unloaded ", unloaded.size(), " pipeline(s) at exit", unloaded.empty() ? "" : ": ",
            names);
}

void PipelinePool::InTurn(std::vector<c10::Device> devices, DevicePool::Step step,
                          std::function<void(const Status&)> done) {
  devices_.RunInTurn(std::move(devices), std::move(step), std::move(done));
}

}  // namespace qpool
