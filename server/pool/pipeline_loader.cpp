#include "pool/pipeline_loader.h"

#include <memory>
#include <utility>

#include "util/log.h"

namespace qpool {

void LoadReplicas(PipelineRegistry& registry, DevicePool& pool, const std::string& name,
                  std::vector<c10::Device> devices, std::function<void(const LoadResult&)> loaded,
                  std::function<void(const Status&)> done) {
  auto plan = registry.PlanHostRoom(name, devices.size());
  if (!plan.ok()) {
    done(plan.status());
    return;
  }
  // Every unload of the victims' replicas, then every load, each on its device's worker.
  std::vector<c10::Device> order;
  std::vector<DevicePool::Step> steps;
  std::vector<std::string> victims;
  for (const auto& [victim, victim_devices] : *plan) {
    victims.push_back(victim);
    for (const auto& device : victim_devices) {
      order.push_back(device);
      steps.push_back([&registry, victim = victim](const c10::Device& d) {
        return registry.Unload(victim, d).status();
      });
    }
  }
  for (const auto& device : devices) {
    order.push_back(device);
    steps.push_back([&registry, name, loaded](const c10::Device& d) -> Status {
      ASSIGN_OR_RETURN(LoadResult result, registry.Load(name, d));
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
  // Never at other pipelines' expense in host memory: it must fit as it is.
  auto room = registry_.PlanHostRoom(name, 1, /*evict=*/false);
  if (!room.ok()) {
    done(room.status());
    return;
  }
  pool_.RunInTurn(
      {device},
      [this, name](const c10::Device& d) -> Status {
        // An unload may have come first: a scale-out does not load the pipeline back.
        RETURN_IF_ERROR(registry_.Manifest(name).status());
        return registry_.Load(name, d).status();
      },
      done);
}

void OnDemandLoader::EnsureLoaded(const std::string& name,
                                  std::function<void(const Status&)> then) {
  StatusOr<std::vector<c10::Device>> devices = std::vector<c10::Device>{};
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto waiting = waiting_.find(name);
    if (waiting != waiting_.end()) {
      waiting->second.push_back(std::move(then));
      return;
    }
    devices = registry_.PlanLoad(name, "");
    if (devices.ok() && !devices->empty()) waiting_[name].push_back(std::move(then));
  }
  if (!devices.ok() || devices->empty()) {  // an error, or loaded already
    then(devices.status());
    return;
  }
  log::Info("loading pipeline '", name, "' for a request (--load-on-demand)");
  LoadReplicas(registry_, pool_, name, std::move(devices).value(), nullptr,
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
