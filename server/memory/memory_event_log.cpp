#include "memory/memory_event_log.h"

#include <algorithm>

#include "util/log.h"

namespace qpool {

const char* MemoryEventKindName(MemoryEventKind kind) {
  switch (kind) {
    case MemoryEventKind::kLoad:
      return "load";
    case MemoryEventKind::kUnload:
      return "unload";
    case MemoryEventKind::kOffload:
      return "offload";
    case MemoryEventKind::kOnload:
      return "onload";
    case MemoryEventKind::kMove:
      return "move";
    case MemoryEventKind::kEmptyCache:
      return "empty_cache";
    case MemoryEventKind::kOom:
      return "oom";
    case MemoryEventKind::kLeak:
      return "leak";
    case MemoryEventKind::kStream:
      return "stream";
  }
  return "unknown";
}

const char* MemoryEventOutcomeName(MemoryEventOutcome outcome) {
  switch (outcome) {
    case MemoryEventOutcome::kOk:
      return "ok";
    case MemoryEventOutcome::kError:
      return "error";
    case MemoryEventOutcome::kLeak:
      return "leak";
  }
  return "unknown";
}

MemoryEventLog::MemoryEventLog(size_t capacity) : capacity_(std::max<size_t>(capacity, 1)) {}

uint64_t MemoryEventLog::Append(MemoryEvent event) {
  std::vector<Listener> listeners;
  {
    std::lock_guard<std::mutex> lock(mu_);
    event.sequence = ++last_sequence_;
    if (event.unix_nanos == 0) {
      event.unix_nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
    }
    events_.push_back(event);
    if (events_.size() > capacity_) events_.pop_front();
    listeners = listeners_;
  }
  cv_.notify_all();
  for (const auto& listener : listeners) listener(event);
  return event.sequence;
}

std::vector<MemoryEvent> MemoryEventLog::Since(uint64_t after, size_t max) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<MemoryEvent> out;
  for (const auto& e : events_) {
    if (e.sequence <= after) continue;
    if (out.size() >= max) break;
    out.push_back(e);
  }
  return out;
}

std::vector<MemoryEvent> MemoryEventLog::Recent(size_t max) const {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t n = std::min(max, events_.size());
  return std::vector<MemoryEvent>(events_.end() - static_cast<std::ptrdiff_t>(n), events_.end());
}

bool MemoryEventLog::WaitFor(uint64_t after, std::chrono::steady_clock::time_point deadline,
                             const std::function<bool()>& stop) const {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (last_sequence_ > after) return true;
    if ((stop && stop()) || std::chrono::steady_clock::now() >= deadline) return false;
    const auto wake =
        std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(100));
    cv_.wait_until(lock, wake);
  }
}

uint64_t MemoryEventLog::last_sequence() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_sequence_;
}

uint64_t MemoryEventLog::first_available() const {
  std::lock_guard<std::mutex> lock(mu_);
  return events_.empty() ? last_sequence_ + 1 : events_.front().sequence;
}

void MemoryEventLog::AddListener(Listener listener) {
  std::lock_guard<std::mutex> lock(mu_);
  listeners_.push_back(std::move(listener));
}

}  // namespace qpool
