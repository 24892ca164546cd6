// IdleOffloader: offloads pipelines whose `idle` policy timed out.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "pool/device_pool.h"
#include "pool/pipeline_registry.h"

namespace qpool {

// A thread that checks every `period` which pipelines are due and queues their offload on their
// device's worker (so it is ordered with their requests). Thread safety: Stop may be called from
// any thread, and is called by the destructor.
class IdleOffloader {
 public:
  IdleOffloader(PipelineRegistry& registry, DevicePool& devices,
                std::chrono::milliseconds period = std::chrono::milliseconds(500));
  ~IdleOffloader();
  void Stop();

 private:
  void Run();

  PipelineRegistry& registry_;
  DevicePool& devices_;
  const std::chrono::milliseconds period_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace qpool
