// The memory timeline of `qpool bench`: ModelService/GetMemoryReport sampled periodically (each
// device's allocated and reserved bytes) and the ModelService/WatchMemory event stream (load,
// offload, oom, ...), from Start() to Stop().
//
// Thread-safety: Start, Stop and Take are called from one thread; the sampler and watcher threads
// share only `points_`, `warnings_` and the stop state, all under `mutex_`.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench_load.h"
#include "bench_record.h"
#include "connection.h"

namespace qpool::cli {

class MemoryMonitor {
 public:
  // `interval_seconds` between samples (0: no sampling, events only). `origin` and
  // `origin_wall` are the same instant on the monotonic and the wall clock: time 0 of the
  // points (the server stamps events with wall-clock time).
  MemoryMonitor(const Connection& connection, double interval_seconds,
                BenchClock::time_point origin, std::chrono::system_clock::time_point origin_wall);
  ~MemoryMonitor();  // Stop()
  MemoryMonitor(const MemoryMonitor&) = delete;
  MemoryMonitor& operator=(const MemoryMonitor&) = delete;

  // Takes a first sample, then starts the sampler and watcher threads.
  void Start();
  // Takes a last sample and stops both threads; idempotent.
  void Stop();
  // The points in time order, and what went wrong (an RPC the server refused, ...).
  std::vector<MemoryPoint> TakePoints();
  std::vector<std::string> TakeWarnings();

 private:
  void Sample();
  void SampleLoop();
  void WatchLoop();
  double Since(BenchClock::time_point t) const;
  void Warn(std::string warning);

  const Connection& connection_;
  const double interval_seconds_;
  const BenchClock::time_point origin_;
  const std::chrono::system_clock::time_point origin_wall_;
  std::unique_ptr<v1::ModelService::Stub> stub_;
  std::thread sampler_;
  std::thread watcher_;

  std::mutex mutex_;  // guards everything below
  std::condition_variable stop_changed_;
  bool stopping_ = false;
  grpc::ClientContext* watch_context_ = nullptr;  // the stream to cancel at Stop()
  std::vector<MemoryPoint> points_;
  std::vector<std::string> warnings_;
};

}  // namespace qpool::cli
