#include "bench_memory.h"

#include <algorithm>

namespace qpool::cli {
namespace {

// Distinct warnings kept; a server refusing every sample says so once per message anyway.
constexpr size_t kMaxWarnings = 10;

std::chrono::system_clock::time_point After(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             std::chrono::duration<double>(seconds));
}

std::string EventDetail(const v1::MemoryEvent& e) {
  std::string detail;
  auto add = [&detail](const std::string& part) {
    if (!part.empty()) detail += (detail.empty() ? "" : "; ") + part;
  };
  if (!e.component().empty()) add("component " + e.component());
  if (!e.from_device().empty() || !e.to_device().empty()) {
    add(e.from_device() + " -> " + e.to_device());
  }
  if (!e.outcome().empty() && e.outcome() != "ok") add(e.outcome());
  add(e.message());
  return detail;
}

}  // namespace

MemoryMonitor::MemoryMonitor(const Connection& connection, double interval_seconds,
                             BenchClock::time_point origin,
                             std::chrono::system_clock::time_point origin_wall)
    : connection_(connection),
      interval_seconds_(interval_seconds),
      origin_(origin),
      origin_wall_(origin_wall),
      stub_(v1::ModelService::NewStub(connection.channel())) {}

MemoryMonitor::~MemoryMonitor() { Stop(); }

void MemoryMonitor::Start() {
  if (interval_seconds_ > 0) {
    Sample();
    sampler_ = std::thread([this] { SampleLoop(); });
  }
  watcher_ = std::thread([this] { WatchLoop(); });
}

void MemoryMonitor::Stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    if (watch_context_ != nullptr) watch_context_->TryCancel();
    stop_changed_.notify_all();
  }
  if (sampler_.joinable()) sampler_.join();
  if (watcher_.joinable()) watcher_.join();
  if (interval_seconds_ > 0) Sample();
}

std::vector<MemoryPoint> MemoryMonitor::TakePoints() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<MemoryPoint> points = std::move(points_);
  std::stable_sort(points.begin(), points.end(),
                   [](const MemoryPoint& a, const MemoryPoint& b) { return a.time_s < b.time_s; });
  return points;
}

std::vector<std::string> MemoryMonitor::TakeWarnings() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::move(warnings_);
}

double MemoryMonitor::Since(BenchClock::time_point t) const {
  return std::chrono::duration<double>(t - origin_).count();
}

void MemoryMonitor::Warn(std::string warning) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (warnings_.size() < kMaxWarnings &&
      std::find(warnings_.begin(), warnings_.end(), warning) == warnings_.end()) {
    warnings_.push_back(std::move(warning));
  }
}

void MemoryMonitor::Sample() {
  grpc::ClientContext context;
  connection_.Prepare(&context);
  context.set_deadline(After(std::clamp(4 * interval_seconds_, 1.0, 5.0)));
  v1::GetMemoryReportRequest request;  // max_events 0: the watcher has the events
  v1::MemoryReport report;
  const BenchClock::time_point sent = BenchClock::now();
  const grpc::Status status = stub_->GetMemoryReport(&context, request, &report);
  if (!status.ok()) {
    Warn(std::string("memory samples: GetMemoryReport failed: ") +
         StatusCodeName(status.error_code()) + ": " + status.error_message());
    return;
  }
  // Halfway through the call is the best guess of when the server took the sample.
  const double time_s = Since(sent + (BenchClock::now() - sent) / 2);
  const std::string peer = AnsweringPeer(context);
  std::lock_guard<std::mutex> lock(mutex_);
  for (const v1::DeviceMemory& d : report.devices()) {
    MemoryPoint p;
    p.time_s = time_s;
    p.peer = peer;
    p.device = d.device();
    p.kind = "sample";
    p.allocated_bytes = d.allocated_bytes();
    p.reserved_bytes = d.reserved_bytes();
    p.total_bytes = d.total_bytes();
    points_.push_back(std::move(p));
  }
}

void MemoryMonitor::SampleLoop() {
  const auto interval = std::chrono::duration_cast<BenchClock::duration>(
      std::chrono::duration<double>(interval_seconds_));
  BenchClock::time_point next = BenchClock::now() + interval;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (stop_changed_.wait_until(lock, next, [this] { return stopping_; })) return;
    }
    Sample();
    // A slow answer skips ticks rather than sending a burst to catch up.
    next = std::max(next + interval, BenchClock::now());
  }
}

void MemoryMonitor::WatchLoop() {
  grpc::ClientContext context;
  connection_.Prepare(&context);
  context.set_deadline(std::chrono::system_clock::time_point::max());  // until Stop()
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    watch_context_ = &context;
  }
  v1::WatchMemoryRequest request;  // after_sequence 0: events from now on
  auto reader = stub_->WatchMemory(&context, request);
  v1::MemoryEvent e;
  while (reader->Read(&e)) {
    MemoryPoint p;
    if (e.unix_nanos() > 0) {
      p.time_s = static_cast<double>(e.unix_nanos()) / 1e9 -
                 std::chrono::duration<double>(origin_wall_.time_since_epoch()).count();
    } else {
      p.time_s = Since(BenchClock::now());
    }
    p.peer = AnsweringPeer(context);
    p.device = e.device();
    p.kind = e.kind();
    p.allocated_bytes = e.allocated_after();
    p.reserved_bytes = e.reserved_after();
    p.pipeline = e.pipeline();
    p.detail = EventDetail(e);
    std::lock_guard<std::mutex> lock(mutex_);
    points_.push_back(std::move(p));
  }
  const grpc::Status status = reader->Finish();
  bool stopped = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    watch_context_ = nullptr;
    stopped = stopping_;
  }
  if (!(stopped && status.error_code() == grpc::StatusCode::CANCELLED)) {
    Warn(std::string("memory events: WatchMemory ended: ") + StatusCodeName(status.error_code()) +
         ": " + status.error_message());
  }
}

}  // namespace qpool::cli
