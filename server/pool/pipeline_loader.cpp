#include "pool/pipeline_loader.h"

#include <memory>
#include <utility>

#include "util/log.h"

namespace qpool {

void LoadReplicas(PipelineRegistry& registry, DevicePool& pool, const std::string& name,
                  LoadPlan plan, std::function<void(const LoadResult&)> loaded,
                  std::function<void(const Status&)> done) {
  // A broken manifest needs no room: its load only records the error.
  StatusOr<HostEvictionPlan> evictions = HostEvictionPlan{};
  if (plan.manifest.ok()) evictions = registry.PlanHostRoom(**plan.manifest, plan.devices.size());
  if (!evictions.ok()) {
    done(evictions.status());
    return;
  }
  // Every unload of the victims' replicas, then every load, each on its device's worker.
  std::vector<c10::Device> order;
  std::vector<DevicePool::Step> steps;
  std::vector<std::string> victims;
  for (const auto& [victim, victim_devices] : *evictions) {
    victims.push_back(victim);
    for (const auto& device : victim_devices) {
      order.push_back(device);
      steps.push_back([&registry, victim = victim](const c10::Device& d) {
        return registry.Unload(victim, d).status();
      });
    }
  }
  auto manifest = std::make_shared<const StatusOr<std::shared_ptr<const PipelineManifest>>>(
      std::move(plan.manifest));
  for (const auto& device : plan.devices) {
    order.push_back(device);
    steps.push_back([&registry, name, manifest, loaded](const c10::Device& d) -> Status {
      ASSIGN_OR_RETURN(LoadResult result, registry.Load(name, *manifest, d));
      if (loaded) loaded(result);
      return Status::Ok();
    });
  }
  auto next = std::make_shared<size_t>(0);
  pool.RunInTurn(
      std::move(order),
      [steps = std::move(steps), next](const c10::Device& d) { return steps.at((*next)++)(d); },
      [&registry, victims = std::move(victims), done = std::move(done)](const Status& status) {
        for (const auto& victim : victims) registry.EndUnload(victim);
        done(status);
      });
}

OnDemandLoader::OnDemandLoader(PipelineRegistry& registry, DevicePool& pool)
    : registry_(registry), pool_(pool) {}

void OnDemandLoader::AddReplica(const std::string& name, const c10::Device& device) {
  log::Info("every replica of '", name, "' is busy: loading another on ", device.str(),
            " (placement.max_replicas)");
  auto done = [this, name, device](const Status& status) {
    if (!status.ok()) {
      log::Warn("scale-out of '", name, "' on ", device.str(), " failed: ", status.message());
    }
    registry_.EndScaleOut(name);
  };
  // The loaded replicas' manifest: a scale-out adds a copy of what is served.
  auto loaded = registry_.Manifest(name);
  if (!loaded.ok()) {
    done(loaded.status());
    return;
  }
  std::shared_ptr<const PipelineManifest> manifest = loaded->manifest;
  // Never at other pipelines' expense in host memory: it must fit as it is.
  auto room = registry_.PlanHostRoom(*manifest, 1, /*evict=*/false);
  if (!room.ok()) {
    done(room.status());
    return;
  }
  pool_.RunInTurn(
      {device},
      [this, name, manifest](const c10::Device& d) -> Status {
        // An unload may have come first: a scale-out does not load the pipeline back.
        RETURN_IF_ERROR(registry_.Manifest(name).status());
        return registry_.Load(name, manifest, d).status();
      },
      done);
}

void OnDemandLoader::EnsureLoaded(const std::string& name,
                                  std::function<void(const Status&)> then) {
  StatusOr<LoadPlan> plan = LoadPlan{};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto waiting = waiting_.find(name);
    if (waiting != waiting_.end()) {
      waiting->second.push_back(std::move(then));
      return;
    }
    plan = registry_.PlanLoad(name, "");
    if (plan.ok() && !plan->devices.empty()) waiting_[name].push_back(std::move(then));
  }
  if (!plan.ok() || plan->devices.empty()) {  // an error, or loaded already
    then(plan.status());
    return;
  }
  log::Info("loading pipeline '", name, "' for a request (--load-on-demand)");
  LoadReplicas(registry_, pool_, name, std::move(plan).value(), nullptr,
               [this, name](const Status& status) {
                 std::vector<std::function<void(const Status&)>> waiters;
                 {
                   std::lock_guard<std::mutex> lock(mu_);
                   waiters = std::move(waiting_[name]);
                   waiting_.erase(name);
                 }
                 for (auto& waiter : waiters) waiter(status);
               });
}

}  // namespace qpool
