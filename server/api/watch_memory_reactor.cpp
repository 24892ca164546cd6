#include "api/watch_memory_reactor.h"

#include "api/proto_convert.h"

namespace qpool::api {

WatchMemoryReactor::WatchMemoryReactor(const MemoryEventLog& log, uint64_t after_sequence,
                                       const std::atomic<bool>* draining)
    : log_(log), after_(after_sequence), draining_(draining) {
  thread_ = std::thread([this] { Run(); });
}

void WatchMemoryReactor::Run() {
  // 0 = only events from now on.
  uint64_t after = after_ == 0 ? log_.last_sequence() : after_;
  auto draining = [this] { return draining_ != nullptr && draining_->load(); };
  auto stop = [this, &draining] { return stopped_.load() || draining(); };
  while (!stop()) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    if (!log_.WaitFor(after, deadline, stop)) continue;
    const uint64_t first = log_.first_available();
    for (const auto& event : log_.Since(after, 64)) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return !writing_ || stopped_; });
      if (stopped_) break;
      message_.Clear();
      ToProto(event, first, &message_);
      writing_ = true;
      StartWrite(&message_);
      after = event.sequence;
    }
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !writing_; });
  Finish(draining() ? grpc::Status(grpc::StatusCode::UNAVAILABLE,
                                   "the server is draining before it stops; watch another replica")
                    : grpc::Status(grpc::StatusCode::CANCELLED, "watch ended"));
}

void WatchMemoryReactor::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  writing_ = false;
  if (!ok) stopped_ = true;
  cv_.notify_all();
}

void WatchMemoryReactor::OnCancel() {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  cv_.notify_all();
}

void WatchMemoryReactor::OnDone() {
  if (thread_.joinable()) thread_.join();
  delete this;
}

}  // namespace qpool::api
