// WatchMemoryReactor: streams memory events to one WatchMemory caller, without a thread of its
// own (Note [Watchers without threads] in api/watch_hub.h).
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <mutex>

#include "api/watch_hub.h"
#include "memory/memory_event.h"
#include "qpool/v1/qpool.pb.h"

namespace qpool::api {

// Owns itself: deleted in OnDone, after Finish, which is called exactly once (by the hub's
// Close, a failed or fallen-behind stream, a cancel, or at once when the hub refuses it).
// Thread safety: Push, End and the gRPC callbacks take mu_; StartWrite and Finish are called
// with it held (gRPC's reactor calls do not call back synchronously).
class WatchMemoryReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // The queue of events a stream may be behind before it ends.
  static constexpr size_t kMaxQueued = 1024;

  // Streams the events after `after_sequence` (0: only new ones) of `hub`'s log; `hub` outlives
  // the call.
  WatchMemoryReactor(WatchHub& hub, uint64_t after_sequence);

  // Queues `event` (from the hub) and writes it when no write is in flight.
  void Push(const MemoryEvent& event);
  // Finishes the stream with `status` once the write in flight, if any, completes.
  void End(const grpc::Status& status);

  void OnWriteDone(bool ok) override;
  void OnCancel() override { End(grpc::Status(grpc::StatusCode::CANCELLED, "watch ended")); }
  void OnDone() override;

 private:
  // Writes the next queued event, or finishes when asked to; mu_ held.
  void WriteNextLocked();

  WatchHub& hub_;
  bool registered_ = false;
  std::mutex mu_;
  std::deque<MemoryEvent> queue_;
  uint64_t last_queued_ = 0;  // the newest sequence queued (events are queued once, in order)
  uint64_t first_available_ = 0;
  bool writing_ = false;
  bool ending_ = false;
  bool finished_ = false;
  grpc::Status final_status_;
  grpc::ByteBuffer message_;  // the event being written, serialized (api/raw_call.h)
};

}  // namespace qpool::api
