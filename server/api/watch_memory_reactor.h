// WatchMemoryReactor: streams memory events to one WatchMemory caller.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "memory/memory_event_log.h"
#include "qpool/v1/qpool.pb.h"

namespace qpool::api {

// A thread per call waits on the log and writes one event at a time (gRPC allows one write in
// flight). It ends when the client cancels, a write fails, the server shuts down or, within
// 100 ms, when the server starts draining (UNAVAILABLE: Note [Drain] in main.cpp); it deletes
// itself in OnDone after joining its thread.
class WatchMemoryReactor final : public grpc::ServerWriteReactor<v1::MemoryEvent> {
 public:
  // `draining` may be null (never drains); it outlives the call.
  WatchMemoryReactor(const MemoryEventLog& log, uint64_t after_sequence,
                     const std::atomic<bool>* draining);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  void Run();

  const MemoryEventLog& log_;
  const uint64_t after_;
  const std::atomic<bool>* const draining_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool writing_ = false;
  std::atomic<bool> stopped_{false};
  v1::MemoryEvent message_;
  std::thread thread_;
};

}  // namespace qpool::api
