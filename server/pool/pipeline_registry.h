// PipelineRegistry: which pipelines of the model repository are loaded, where, and how many
// requests each has in flight.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "config/model_repository.h"
#include "pipeline/sd_pipeline.h"
#include "pool/device_pool.h"
#include "util/status.h"

namespace qpool {

enum class PipelineState { kAvailable, kLoading, kLoaded, kFailed };

struct ComponentStatus {
  std::string name;
  std::string device;
  std::string dtype;
  std::string quantization;
  ComponentBytes bytes;
};

// A snapshot for ListPipelines / GetMemoryReport.
struct PipelineStatus {
  std::string name;
  std::string kind;
  PipelineState state = PipelineState::kAvailable;
  std::string device;
  std::string error;
  uint32_t in_flight = 0;
  std::vector<ComponentStatus> components;
  GenerationDefaults defaults;
};

struct LoadResult {
  PipelineStatus pipeline;
  double load_seconds = 0;
  bool already_loaded = false;
};

// Holds a loaded pipeline for one request; the pipeline cannot be unloaded while a lease lives.
class PipelineLease {
 public:
  PipelineLease(std::shared_ptr<SdPipeline> pipeline, std::shared_ptr<std::atomic<int>> in_flight,
                DeviceWorker* worker)
      : pipeline_(std::move(pipeline)), in_flight_(std::move(in_flight)), worker_(worker) {}
  ~PipelineLease() { in_flight_->fetch_sub(1); }
  PipelineLease(const PipelineLease&) = delete;
  PipelineLease& operator=(const PipelineLease&) = delete;

  SdPipeline& pipeline() { return *pipeline_; }
  // The worker of the pipeline's device; requests run there.
  DeviceWorker& worker() { return *worker_; }

 private:
  std::shared_ptr<SdPipeline> pipeline_;
  std::shared_ptr<std::atomic<int>> in_flight_;
  DeviceWorker* worker_;
};

// Thread safety: all public methods take the mutex; loading itself runs without it (the entry is
// marked kLoading meanwhile). Do not call a public method from another one.
class PipelineRegistry {
 public:
  PipelineRegistry(ModelRepository repository, DevicePool& devices);

  // Loads `name` on `device` ("" or "auto": the manifest's placement, then the pool's choice).
  // Blocks while loading; call it from a device worker or a thread of its own, not a gRPC thread.
  // OK with already_loaded when it is loaded (FailedPrecondition if `device` names another
  // device than the one it is on); FailedPrecondition while another load of it runs.
  StatusOr<LoadResult> Load(const std::string& name, const std::string& device);
  // Drops every tensor of `name`; returns the bytes it held. FailedPrecondition with requests in
  // flight or when not loaded; NotFound when the repository has no such pipeline.
  StatusOr<uint64_t> Unload(const std::string& name);
  // Every pipeline of the repository, loaded or not, sorted by name.
  std::vector<PipelineStatus> List();
  // Loaded pipelines only.
  std::vector<PipelineStatus> ListLoaded();
  // A lease on a loaded pipeline. InvalidArgument for bad names, NotFound for unknown ones,
  // FailedPrecondition when it is not loaded.
  StatusOr<std::unique_ptr<PipelineLease>> Acquire(const std::string& name);
  // The device a Load of `name` would use, for routing the load onto that device's worker.
  StatusOr<c10::Device> PlanDevice(const std::string& name, const std::string& device);

 private:
  struct Entry {
    PipelineState state = PipelineState::kAvailable;
    std::string error;
    std::shared_ptr<SdPipeline> pipeline;
    std::shared_ptr<std::atomic<int>> in_flight = std::make_shared<std::atomic<int>>(0);
  };
  PipelineStatus StatusOf(const std::string& name, const Entry& entry) const;

  const ModelRepository repository_;
  DevicePool& devices_;
  std::mutex mu_;
  std::map<std::string, Entry> entries_;
};

const char* PipelineStateName(PipelineState state);

}  // namespace qpool
