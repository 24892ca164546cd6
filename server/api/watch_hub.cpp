#include "api/watch_hub.h"

#include <vector>

#include "api/watch_memory_reactor.h"

namespace qpool::api {

WatchHub::WatchHub(MemoryEventLog& log, size_t max_watchers)
    : log_(log), max_watchers_(max_watchers) {
  link_->hub = this;
  log.AddListener([link = link_](const MemoryEvent& event) {
    std::lock_guard<std::mutex> lock(link->mu);
    if (link->hub != nullptr) link->hub->Deliver(event);
  });
}

WatchHub::~WatchHub() {
  std::lock_guard<std::mutex> lock(link_->mu);
  link_->hub = nullptr;
}

bool WatchHub::Add(WatchMemoryReactor* watcher) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || watchers_.size() >= max_watchers_) return false;
  watchers_.insert(watcher);
  return true;
}

void WatchHub::Remove(WatchMemoryReactor* watcher) {
  std::lock_guard<std::mutex> lock(mu_);
  watchers_.erase(watcher);
}

void WatchHub::Deliver(const MemoryEvent& event) {
  // Under mu_: a watcher leaves the set in its OnDone, after its Finish, and a finished watcher
  // ignores Push; so every pointer here is alive.
  std::lock_guard<std::mutex> lock(mu_);
  for (WatchMemoryReactor* watcher : watchers_) watcher->Push(event);
}

void WatchHub::Close(const grpc::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  closed_status_ = status;
  for (WatchMemoryReactor* watcher : watchers_) watcher->End(status);
}

void WatchHub::Open() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = false;
}

size_t WatchHub::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return watchers_.size();
}

}  // namespace qpool::api
