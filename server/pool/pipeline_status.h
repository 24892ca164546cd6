// What the pool reports about its pipelines: their state, replicas and component bytes, and what
// a load or an unload did. Plain values, copied out of the registry under its mutex.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "component/component.h"
#include "config/manifest.h"
#include "config/offload_policy.h"
#include "pipeline/load_stages.h"

namespace qpool {

enum class PipelineState { kAvailable, kLoading, kLoaded, kFailed };

// "available", "loading", "loaded" or "failed".
const char* PipelineStateName(PipelineState state);

struct ComponentStatus {
  std::string name;
  std::string device;
  std::string dtype;
  std::string quantization;
  ComponentBytes bytes;
  std::string residency;    // "unloaded", "host" or "device"
  uint64_t host_bytes = 0;  // host copy
};

// How often a replica's component ran, and how often its compiled forward answered.
struct ComponentForwards {
  std::string component;
  uint64_t total = 0;
  uint64_t compiled = 0;
  bool has_compiled = false;       // a compiled forward is attached
  std::string compiled_attention;  // its attention order (CompiledForward::attention)
};

// One copy of a pipeline on one device.
struct ReplicaStatus {
  std::string device;
  std::string residency;  // "device", "host" or "partial" (some components on each)
  uint32_t in_flight = 0;
  uint64_t device_bytes = 0;                // attributed bytes on `device`
  uint64_t host_bytes = 0;                  // pinned host copies
  std::vector<ComponentForwards> forwards;  // one per component, in manifest order
};

// A snapshot for ListPipelines / GetMemoryReport.
struct PipelineStatus {
  std::string name;
  std::string kind;
  PipelineState state = PipelineState::kAvailable;
  std::string device;  // the first replica's
  std::string error;
  uint32_t in_flight = 0;                   // all replicas
  std::vector<ComponentStatus> components;  // the first replica's
  std::vector<ReplicaStatus> replicas;
  GenerationDefaults defaults;
  std::vector<std::string> schedulers;  // the samplers its kind runs (SamplerNames)
  OffloadPolicy policy;
  int max_queue = 0;      // limits.max_queue of a loaded pipeline
  BatchingSpec batching;  // of a loaded pipeline
  // Files the first replica was read from that changed on disk since (Pipeline::
  // FilesChangedSinceLoad): it serves what it read until it is loaded again.
  std::vector<std::string> files_changed;
};

struct LoadResult {
  PipelineStatus pipeline;
  double load_seconds = 0;
  bool already_loaded = false;
  LoadStages stages;  // Note [Load stages]
};

// What an unload freed and whether the devices got it all back.
struct UnloadResult {
  uint64_t freed_bytes = 0;   // attributed bytes the replicas held
  uint64_t leaked_bytes = 0;  // Note [Leak check]
};

// Admin residency changes. OFFLOAD: every component to pinned host memory. ONLOAD: back to the
// replica's device, or to a named one. MOVE: to a named device.
enum class ResidencyChange { kOffload, kOnload, kMove };

}  // namespace qpool
