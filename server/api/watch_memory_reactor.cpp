#include "api/watch_memory_reactor.h"

#include "api/proto_convert.h"
#include "api/raw_call.h"

namespace qpool::api {

WatchMemoryReactor::WatchMemoryReactor(WatchHub& hub, uint64_t after_sequence) : hub_(hub) {
  const MemoryEventLog& log = hub.log();
  // Registered first, then the backlog read: an event appended in between arrives twice and is
  // queued once (Push skips sequences already queued).
  std::lock_guard<std::mutex> lock(mu_);
  last_queued_ = after_sequence == 0 ? log.last_sequence() : after_sequence;
  first_available_ = log.first_available();
  if (!hub.Add(this)) {
    ending_ = true;
    final_status_ = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                 "too many WatchMemory streams are open (or the server is "
                                 "draining); retry later");
    WriteNextLocked();
    return;
  }
  registered_ = true;
  if (after_sequence != 0) {
    for (auto& event : log.Since(after_sequence, kMaxQueued)) {
      queue_.push_back(std::move(event));
      last_queued_ = queue_.back().sequence;
    }
  }
  WriteNextLocked();
}

void WatchMemoryReactor::Push(const MemoryEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ending_ || event.sequence <= last_queued_) return;
  if (queue_.size() >= kMaxQueued) {
    ending_ = true;
    final_status_ = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                 "this WatchMemory stream fell " + std::to_string(kMaxQueued) +
                                     " events behind; watch again with after_sequence " +
                                     std::to_string(last_queued_ - queue_.size()));
    queue_.clear();
  } else {
    queue_.push_back(event);
    last_queued_ = event.sequence;
  }
  WriteNextLocked();
}

void WatchMemoryReactor::End(const grpc::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ending_) return;
  ending_ = true;
  final_status_ = status;
  queue_.clear();
  WriteNextLocked();
}

void WatchMemoryReactor::WriteNextLocked() {
  if (writing_ || finished_) return;
  if (ending_) {
    finished_ = true;
    Finish(final_status_);
    return;
  }
  if (queue_.empty()) return;
  v1::MemoryEvent event;
  ToProto(queue_.front(), first_available_, &event);
  message_ = SerializeRaw(event);
  queue_.pop_front();
  writing_ = true;
  StartWrite(&message_);
}

void WatchMemoryReactor::OnWriteDone(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  writing_ = false;
  if (!ok && !ending_) {
    ending_ = true;
    final_status_ = grpc::Status(grpc::StatusCode::CANCELLED, "watch ended");
  }
  WriteNextLocked();
}

void WatchMemoryReactor::OnDone() {
  if (registered_) hub_.Remove(this);
  delete this;
}

}  // namespace qpool::api
