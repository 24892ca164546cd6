// WatchHub: the open WatchMemory streams. It hands every memory event to each of them, bounds
// how many may be open, and ends them all when the server drains or stops.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <set>

#include "memory/memory_event_log.h"

namespace qpool::api {

class WatchMemoryReactor;

// Note [Watchers without threads]
// A WatchMemory stream holds no thread: the hub, a listener of the memory event log, queues each
// new event on every open stream, which writes it from the appending thread or from its previous
// write's completion (gRPC allows one write in flight). A stream that falls more than its queue
// behind ends with RESOURCE_EXHAUSTED naming the sequence to resume from; past max_watchers a
// new stream is refused with RESOURCE_EXHAUSTED; Close ends every stream at once (drain: the
// client sees UNAVAILABLE), so that gRPC's shutdown never waits on a watcher.
//
// Thread safety: every method takes the mutex and may be called from any thread; the streams'
// callbacks run without it.
class WatchHub {
 public:
  // Listens to `log`, which must outlive the hub (its listener outlives it and then does
  // nothing).
  WatchHub(MemoryEventLog& log, size_t max_watchers);
  ~WatchHub();
  WatchHub(const WatchHub&) = delete;
  WatchHub& operator=(const WatchHub&) = delete;

  // Registers `watcher`; false when the hub is closed or full (the caller then finishes it).
  bool Add(WatchMemoryReactor* watcher);
  // Unregisters `watcher` (its OnDone).
  void Remove(WatchMemoryReactor* watcher);
  // Ends every open stream with `status` and refuses new ones until Open.
  void Close(const grpc::Status& status);
  // Accepts new streams again (the server serves again).
  void Open();
  size_t size() const;
  const MemoryEventLog& log() const { return log_; }

 private:
  void Deliver(const MemoryEvent& event);

  // What the log's listener reaches: the hub until it is destroyed.
  struct Link {
    std::mutex mu;
    WatchHub* hub = nullptr;
  };

  MemoryEventLog& log_;
  const size_t max_watchers_;
  const std::shared_ptr<Link> link_ = std::make_shared<Link>();
  mutable std::mutex mu_;
  std::set<WatchMemoryReactor*> watchers_;
  bool closed_ = false;
  grpc::Status closed_status_;
};

}  // namespace qpool::api
