// MemoryEventLog: a bounded ring buffer of memory events that clients can read from a sequence
// number and wait on (WatchMemory), with listeners for metrics.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#include "memory/memory_event.h"

namespace qpool {

// Thread safety: all public methods take the mutex and may be called from any thread. Listeners
// run on the appending thread after the mutex is released; they must be quick and must not call
// back into the log.
class MemoryEventLog {
 public:
  using Listener = std::function<void(const MemoryEvent&)>;

  // Keeps the newest `capacity` events (at least 1).
  explicit MemoryEventLog(size_t capacity = 4096);

  // Stamps the event with the next sequence number (and the time, if unset), stores it, wakes
  // waiters and calls the listeners. Returns the sequence number.
  uint64_t Append(MemoryEvent event);
  // Events with sequence > `after`, oldest first, at most `max` of them.
  std::vector<MemoryEvent> Since(uint64_t after, size_t max = SIZE_MAX) const;
  // The newest `max` events, oldest first.
  std::vector<MemoryEvent> Recent(size_t max) const;
  // Blocks until an event with sequence > `after` exists, `deadline` passes or `stop()` returns
  // true (polled every 100 ms). Returns whether such an event exists.
  bool WaitFor(uint64_t after, std::chrono::steady_clock::time_point deadline,
               const std::function<bool()>& stop) const;
  // The newest sequence number (0 before the first event).
  uint64_t last_sequence() const;
  // The oldest sequence number still held (last_sequence() + 1 when empty).
  uint64_t first_available() const;
  // Adds a listener for every later event.
  void AddListener(Listener listener);

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::deque<MemoryEvent> events_;
  uint64_t last_sequence_ = 0;
  std::vector<Listener> listeners_;
};

}  // namespace qpool
