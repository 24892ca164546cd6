// PipelineRegistry's residency changes: admin offload, onload and move of replicas, offload
// policies, and the idle offloads due.
#include <optional>

#include "pool/pipeline_registry.h"

namespace qpool {

StatusOr<std::vector<std::pair<c10::Device, c10::Device>>> PipelineRegistry::PlanChange(
    const std::string& name, ResidencyChange change, const std::string& device) {
  RETURN_IF_ERROR(ValidatePipelineName(name));
  if (change == ResidencyChange::kMove && device.empty()) {
    return InvalidArgument("MovePipeline needs a target device (cpu, cuda:N)");
  }
  if (change != ResidencyChange::kOffload && device == "auto") {
    return InvalidArgument("name the target device (cpu, cuda:N); auto is for loads");
  }
  std::optional<c10::Device> target;
  if (change != ResidencyChange::kOffload && !device.empty()) {
    ASSIGN_OR_RETURN(target, devices_.Resolve(device, nullptr));
  }
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(Entry * entry, LoadedEntry(name));
  std::vector<std::pair<c10::Device, c10::Device>> plan;
  if (!target) {
    for (const auto& r : entry->replicas)
      plan.emplace_back(r.pipeline->device(), r.pipeline->device());
    return plan;
  }
  const c10::Device from = entry->replicas.front().pipeline->device();
  if (entry->replicas.size() > 1) {
    std::string where;
    for (const auto& r : entry->replicas)
      where += (where.empty() ? "" : ", ") + r.pipeline->device().str();
    return FailedPrecondition(StrCat("pipeline '", name, "' has replicas on ", where,
                                     "; a change to one device needs a single replica (unload "
                                     "the others, or omit the device)"));
  }
  // A move to where the pipeline is answers at once: nothing to move, nothing to wait for.
  if (change == ResidencyChange::kMove && from == *target) return plan;
  plan.emplace_back(from, *target);
  return plan;
}

StatusOr<ResidencyReport> PipelineRegistry::ChangeResidency(const std::string& name,
                                                            const c10::Device& replica_device,
                                                            ResidencyChange change,
                                                            const c10::Device& target) {
  RETURN_IF_ERROR(ValidatePipelineName(name));
  std::shared_ptr<Pipeline> pipeline;
  const bool elsewhere = change != ResidencyChange::kOffload && replica_device != target;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSIGN_OR_RETURN(Entry * entry, LoadedEntry(name));
    Replica* replica = FindReplica(*entry, replica_device);
    if (replica == nullptr) {
      return FailedPrecondition(
          StrCat("pipeline '", name, "' has no replica on ", replica_device.str()));
    }
    if (replica->changing) {
      return Unavailable(StrCat("pipeline '", name, "' is being moved; retry shortly"));
    }
    if (elsewhere) {
      if (FindReplica(*entry, target) != nullptr) {
        return FailedPrecondition(
            StrCat("pipeline '", name, "' already has a replica on ", target.str()));
      }
      const int in_flight = replica->load->in_flight.load();
      if (in_flight > 0) {
        return FailedPrecondition(StrCat("pipeline '", name, "' has ", in_flight,
                                         " request(s) in flight; retry when it is idle"));
      }
      replica->changing = true;  // Acquire routes around it meanwhile
    }
    pipeline = replica->pipeline;
  }
  Status room;
  if (change != ResidencyChange::kOffload && target.is_cuda()) {
    const auto bytes = pipeline->residency().BytesByDevice();
    uint64_t total = 0, there = 0;
    for (const auto& [d, b] : bytes) total += b;
    if (auto it = bytes.find(target.str()); it != bytes.end()) there = it->second;
    // Host copies count in `total` too, so this over-asks by what is already on the host.
    room = MakeRoom(target, total > there ? total - there : 0, name,
                    StrCat("moving '", name, "' to ", target.str()));
  }
  StatusOr<ResidencyReport> report = room;
  if (room.ok()) {
    switch (change) {
      case ResidencyChange::kOffload:
        report = pipeline->residency().Offload();
        break;
      case ResidencyChange::kOnload:
        report = pipeline->residency().Onload(target);
        break;
      case ResidencyChange::kMove:
        report = pipeline->residency().MoveTo(target);
        break;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it != entries_.end()) {
    for (auto& r : it->second.replicas) {
      if (r.pipeline == pipeline) r.changing = false;
    }
  }
  return report;
}

Status PipelineRegistry::SetPolicy(const std::string& name, const c10::Device& device,
                                   const OffloadPolicy& policy) {
  RETURN_IF_ERROR(ValidatePipelineName(name));
  std::shared_ptr<Pipeline> pipeline;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ASSIGN_OR_RETURN(Entry * entry, LoadedEntry(name));
    Replica* replica = FindReplica(*entry, device);
    if (replica == nullptr) {
      return FailedPrecondition(StrCat("pipeline '", name, "' has no replica on ", device.str()));
    }
    pipeline = replica->pipeline;
  }
  return pipeline->residency().SetPolicy(policy);
}

std::vector<std::pair<std::string, c10::Device>> PipelineRegistry::IdleOffloadsDue() {
  std::vector<std::pair<std::string, c10::Device>> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [name, entry] : entries_) {
    for (const auto& r : entry.replicas) {
      if (!r.changing && r.load->in_flight.load() == 0 &&
          r.pipeline->residency().IdleOffloadDue()) {
        out.emplace_back(name, r.pipeline->device());
      }
    }
  }
  return out;
}

}  // namespace qpool
