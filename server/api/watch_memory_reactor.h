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
// flight). It ends when the client cancels, a write fails or the server shuts down; it deletes
// itself in OnDone after joining its thread.
class WatchMemoryReactor final : public grpc::ServerWriteReactor<v1::MemoryEvent> {
 public:
  WatchMemoryReactor(const MemoryEventLog& log, uint64_t after_sequence);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  void Run();

  const MemoryEventLog& log_;
  const uint64_t after_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool writing_ = false;
  std::atomic<bool> stopped_{false};
  v1::MemoryEvent message_;
  std::thread thread_;
};

}  // namespace qpool::api
