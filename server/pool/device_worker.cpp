#include "pool/device_worker.h"

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#if QPOOL_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <optional>

#include "util/log.h"

namespace qpool {

DeviceWorker::DeviceWorker(c10::Device device, size_t max_queue)
    : device_(device), max_queue_(max_queue), thread_([this] { Loop(); }) {}

DeviceWorker::~DeviceWorker() { Stop(); }

// Operators' calls waiting at once on one device: far more than a person or a script issues.
constexpr size_t kMaxAdminQueue = 256;

Status DeviceWorker::Submit(Task task, Lane lane) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return Unavailable("server is shutting down");
  if (lane == Lane::kAdmin) {
    if (admin_.size() >= kMaxAdminQueue) {
      return ResourceExhausted(StrCat(kMaxAdminQueue, " admin calls are waiting on ",
                                      device_.str(), "; retry later"));
    }
    admin_.push_back(std::move(task));
  } else {
    if (queue_.size() >= max_queue_) {
      return ResourceExhausted(StrCat("the queue of ", device_.str(), " is full (", max_queue_,
                                      " requests waiting); retry later"));
    }
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return Status::Ok();
}

void DeviceWorker::Stop() {
  std::deque<Task> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    dropped.swap(admin_);
    for (auto& task : queue_) dropped.push_back(std::move(task));
    queue_.clear();
    cv_.notify_all();
  }
  for (auto& task : dropped) task(false);
  if (thread_.joinable()) thread_.join();
}

size_t DeviceWorker::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size() + admin_.size() + (running_task_ ? 1 : 0);
}

void DeviceWorker::Loop() {
  // OpenMP's thread count is per thread: take the process-wide setting (--cpu-threads).
  at::init_num_threads();
#if QPOOL_WITH_CUDA
  // Each GPU worker computes on its own stream so devices never serialize on the default one.
  std::optional<c10::cuda::CUDAGuard> device_guard;
  std::optional<c10::cuda::CUDAStreamGuard> stream_guard;
  if (device_.is_cuda()) {
    device_guard.emplace(device_);
    stream_guard.emplace(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device_.index()));
  }
#endif
  c10::InferenceMode inference;
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty() || !admin_.empty(); });
      std::deque<Task>& lane = !admin_.empty() ? admin_ : queue_;  // Note [Admin lane]
      if (lane.empty()) return;  // stopping
      task = std::move(lane.front());
      lane.pop_front();
      running_task_ = true;
    }
    try {
      task(true);
    } catch (const std::exception& e) {  // tasks report their own errors; this is a bug
      log::Error("task on ", device_.str(), " threw: ", e.what());
    }
    std::lock_guard<std::mutex> lock(mu_);
    running_task_ = false;
  }
}

}  // namespace qpool
