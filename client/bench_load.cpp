#include "bench_load.h"

#include <algorithm>
#include <cmath>
#include <random>

namespace qpool::cli {
namespace {

// How long the sending loop sleeps at most before looking at the stop flag again.
constexpr std::chrono::milliseconds kPoll(100);

}  // namespace

std::string AnsweringPeer(const grpc::ClientContext& context) {
  std::string peer = context.peer();
  for (const char* scheme : {"ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:"}) {
    if (peer.rfind(scheme, 0) == 0) return peer;
  }
  return "";
}

// Note [Who deletes a call]
// A Call is one Generate stream. gRPC calls OnDone last and never touches the reactor after it,
// so OnDone could delete the call itself; but a `delete this` on a gRPC thread can still be
// running when the runner returns and the process starts tearing gRPC down. Instead OnDone hands
// its record and itself to the runner (under the mutex) and touches nothing afterwards; only
// the thread in Run() deletes calls, so a call the runner is still starting or cancelling is
// never deleted under it. Calls are started without the mutex held, so a reaction that gRPC
// runs inline cannot deadlock on it.
class LoadRunner::Call final : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  Call(LoadRunner* runner, PlannedRequest planned, RequestRecord record)
      : runner_(runner),
        request_(std::move(planned.request)),
        deadline_seconds_(planned.deadline_seconds),
        record_(std::move(record)) {}

  void Start(v1::InferenceService::Stub* stub) {
    runner_->connection_.Prepare(&context_);
    if (deadline_seconds_) {
      context_.set_deadline(std::chrono::system_clock::now() +
                            std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                std::chrono::duration<double>(*deadline_seconds_)));
    }
    stub->async()->Generate(&context_, &request_, this);
    StartRead(&response_);
    StartCall();
  }

  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows
    if (response_.has_progress()) {
      if (record_.first_progress_s < 0) record_.first_progress_s = runner_->Now();
    } else if (response_.has_result()) {
      const v1::GenerateResult& result = response_.result();
      got_result_ = true;
      record_.device = result.device();
      record_.route = result.route();
      record_.batch_size = result.batch_size();
      record_.images = static_cast<uint32_t>(result.images_size());
      record_.queue_s = result.timings().queue_seconds();
      record_.server_total_s = result.timings().total_seconds();
    }
    response_.Clear();  // drop the images now rather than with the call
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    record_.end_s = runner_->Now();
    record_.peer = AnsweringPeer(context_);
    if (status.ok() && !got_result_) {
      record_.code = StatusCodeName(grpc::StatusCode::INTERNAL);
      record_.error = "the stream ended without a result";
    } else {
      record_.code = StatusCodeName(status.error_code());
      record_.error = status.error_message();
    }
    runner_->Finished(this, std::move(record_));  // the last use of `this`
  }

 private:
  LoadRunner* const runner_;
  const v1::GenerateRequest request_;
  const std::optional<double> deadline_seconds_;
  grpc::ClientContext context_;
  v1::GenerateResponse response_;
  RequestRecord record_;
  bool got_result_ = false;
};

LoadRunner::LoadRunner(const Connection& connection, LoadOptions options, RequestSource source,
                       BenchClock::time_point origin, const std::atomic<int>* stop)
    : connection_(connection),
      options_(options),
      source_(std::move(source)),
      origin_(origin),
      stop_(stop),
      stub_(v1::InferenceService::NewStub(connection.channel())) {}

LoadRunner::~LoadRunner() {
  std::unique_lock<std::mutex> lock(mutex_);
  ReapLocked(lock);
}

double LoadRunner::Now() const {
  return std::chrono::duration<double>(BenchClock::now() - origin_).count();
}

bool LoadRunner::ShouldSend(uint64_t n, double due_s, bool* warmup) {
  *warmup = n < options_.warmup_requests || due_s < options_.warmup_seconds;
  if (*warmup) return true;
  if (options_.requests && measured_sent_ >= *options_.requests) return false;
  if (measure_start_s_ < 0) measure_start_s_ = due_s;
  if (options_.duration_seconds && due_s >= measure_start_s_ + *options_.duration_seconds) {
    return false;
  }
  ++measured_sent_;
  return true;
}

void LoadRunner::Send(uint64_t n, double due_s, bool warmup) {
  PlannedRequest planned = source_(n);
  RequestRecord record;
  record.index = n;
  record.warmup = warmup;
  record.template_name = planned.template_name;
  record.pipeline = planned.request.pipeline();
  record.scheduled_s = due_s;
  record.start_s = Now();
  auto* call = new Call(this, std::move(planned), std::move(record));
  {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.push_back(call);
  }
  call->Start(stub_.get());
}

void LoadRunner::Finished(Call* call, RequestRecord record) {
  std::lock_guard<std::mutex> lock(mutex_);
  records_.push_back(std::move(record));
  in_flight_.erase(std::find(in_flight_.begin(), in_flight_.end(), call));
  finished_.push_back(call);
  changed_.notify_all();  // under the mutex: Run() may return and destroy changed_ right after
}

void LoadRunner::ReapLocked(std::unique_lock<std::mutex>& lock) {
  std::vector<Call*> done;
  done.swap(finished_);
  lock.unlock();
  for (Call* call : done) delete call;
  lock.lock();
}

std::vector<RequestRecord> LoadRunner::Run() {
  const bool open_loop = options_.rate > 0;
  std::mt19937_64 rng(options_.arrival_seed);
  // The gap to the next arrival; inverse-CDF sampling, the same on every standard library.
  auto next_gap = [&]() {
    if (options_.arrivals == Arrivals::kUniform) return 1 / options_.rate;
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    return -std::log1p(-u) / options_.rate;
  };
  auto stopping = [this](int level) { return stop_ != nullptr && stop_->load() >= level; };

  double next_due = 0;
  uint64_t n = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping(1)) {
    ReapLocked(lock);
    double due = 0;
    if (open_loop) {
      const double now = Now();
      if (now < next_due) {
        const auto at = origin_ + std::chrono::duration_cast<BenchClock::duration>(
                                      std::chrono::duration<double>(next_due));
        changed_.wait_until(lock, std::min(at, BenchClock::now() + kPoll));
        continue;
      }
      due = next_due;
    } else {
      if (in_flight_.size() >= options_.concurrency) {
        changed_.wait_for(lock, kPoll);
        continue;
      }
      due = Now();
    }
    bool warmup = false;
    if (!ShouldSend(n, due, &warmup)) break;
    lock.unlock();
    Send(n++, due, warmup);
    lock.lock();
    if (open_loop) next_due += next_gap();
  }

  bool cancelled = false;
  while (!in_flight_.empty()) {
    if (stopping(2) && !cancelled) {
      // Cancelling may run reactions inline; no call is deleted meanwhile (only this thread
      // deletes them), so the list can be walked without the mutex.
      std::vector<Call*> calls = in_flight_;
      lock.unlock();
      for (Call* call : calls) call->Cancel();
      lock.lock();
      cancelled = true;
    }
    changed_.wait_for(lock, kPoll);
    ReapLocked(lock);
  }
  ReapLocked(lock);
  std::vector<RequestRecord> records = std::move(records_);
  std::sort(records.begin(), records.end(),
            [](const RequestRecord& a, const RequestRecord& b) { return a.index < b.index; });
  return records;
}

}  // namespace qpool::cli
