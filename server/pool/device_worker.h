// DeviceWorker: one thread (and, on a GPU, one CUDA stream) per device, fed by a bounded queue.
#pragma once

#include <c10/core/Device.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "util/status.h"

namespace qpool {

// Thread safety: all public methods take the mutex and may be called from any thread. Tasks run
// on the worker thread without the mutex held, under InferenceMode, with the device (and its
// stream) current.
class DeviceWorker {
 public:
  // A task gets `run == false` when the worker stops before running it; it must then only
  // finish its call (e.g. reply UNAVAILABLE).
  using Task = std::function<void(bool run)>;

  // Starts the thread. `max_queue` bounds waiting requests (the running task is not counted).
  DeviceWorker(c10::Device device, size_t max_queue);
  // Stop() then join.
  ~DeviceWorker();
  DeviceWorker(const DeviceWorker&) = delete;
  DeviceWorker& operator=(const DeviceWorker&) = delete;

  // Note [Admin lane]: operators' calls (load, unload, offload, onload, move, policy changes,
  // and the loads on demand that requests start) wait in a lane of their own, which the worker
  // serves before the requests: under a full request queue they neither get RESOURCE_EXHAUSTED
  // nor wait behind every queued request, only behind the task running. The idle offloader stays
  // in the request lane: it must not run ahead of requests that would find their pipeline gone.
  enum class Lane { kRequest, kAdmin };
  // Queues `task` in `lane`. ResourceExhausted when that lane is full, Unavailable after Stop().
  Status Submit(Task task, Lane lane = Lane::kRequest);
  // Lets the running task finish, hands every queued task `run == false`, and joins.
  void Stop();

  const c10::Device& device() const { return device_; }
  // Tasks waiting plus the one running.
  size_t pending() const;

 private:
  void Loop();

  const c10::Device device_;
  const size_t max_queue_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;  // requests
  std::deque<Task> admin_;  // Note [Admin lane]
  bool running_task_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace qpool
