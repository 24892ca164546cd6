// A fixture for GPU tests that load the exported tiny pipelines with their own residency context.
#pragma once

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "config/model_repository.h"
#include "memory/device_memory.h"
#include "pipeline/pipeline_kinds.h"
#include "testing/test_paths.h"

namespace qpool::testing {

class GpuPipelineTest {
 protected:
  // False (with the reason in `skip`) when there is no GPU or no test repository.
  bool Prepare(std::string* skip) {
    if (!torch::cuda::is_available()) {
      *skip = "no CUDA device";
      return false;
    }
    repo_ = TinyRepository();
    if (repo_.empty()) {
      *skip = "no test repository (build target qpool_test_models)";
      return false;
    }
    return true;
  }

  // Loads `name` on `device`; `policy` overrides the manifest's offload policy when not empty,
  // `offload` the whole offload section when given; `edit` may change the manifest further.
  std::unique_ptr<Pipeline> Load(const std::string& name, const c10::Device& device,
                                 const std::string& policy = "",
                                 const OffloadPolicy* offload = nullptr,
                                 const std::function<void(PipelineManifest&)>& edit = nullptr) {
    auto repository = ModelRepository::Open(repo_, kinds_->Catalog());
    EXPECT_TRUE(repository.ok());
    auto manifest = repository->LoadManifest(name);
    if (!manifest.ok()) {
      ADD_FAILURE() << manifest.status().ToString();
      return nullptr;
    }
    if (!policy.empty()) {
      auto parsed = MakeOffloadPolicy(policy, manifest->offload.idle_seconds);
      EXPECT_TRUE(parsed.ok()) << parsed.status().ToString();
      if (parsed.ok()) manifest->offload = *parsed;
    }
    if (offload != nullptr) manifest->offload = *offload;
    if (edit) edit(*manifest);
    auto pipeline = kinds_->Load(*manifest, device, c10::kHalf, context());
    if (!pipeline.ok()) {
      ADD_FAILURE() << pipeline.status().ToString();
      return nullptr;
    }
    return std::move(pipeline).value();
  }

  // Whether the test repository holds `name` (the quantized variants are optional).
  bool Exported(const std::string& name) const {
    return std::filesystem::exists(repo_ + "/" + name + "/pipeline.yaml");
  }

  ResidencyContext context() { return ResidencyContext{&arenas_, &copier_, &memory_, &events_}; }

  int64_t Allocated(const c10::Device& d) const {
    return static_cast<int64_t>(memory_.Read(d).allocated_bytes);
  }

  // Two 64x64 images, 3 Euler steps with guidance: every component runs.
  static GenerateParams Params() {
    GenerateParams p;
    p.prompt = "a red fox in the snow";
    p.steps = 3;
    p.guidance_scale = 7.5;
    p.width = 64;
    p.height = 64;
    p.num_images = 2;
    p.seed = 42;
    p.scheduler = "euler";
    return p;
  }

  std::string repo_;
  const std::shared_ptr<const PipelineKinds> kinds_ = PipelineKinds::Builtin();
  ArenaAllocator arenas_;
  BlockCopier copier_;
  // NVML where the driver has it (Note [Driver memory]): the memory tests read the driver's view.
  const std::unique_ptr<DriverMemory> driver_ = DriverMemory::Open();
  DeviceMemory memory_{arenas_, driver_.get()};
  MemoryEventLog events_;
};

}  // namespace qpool::testing
