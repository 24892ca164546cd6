// The load of `qpool bench`: Generate calls in a closed loop (a fixed number in flight) or an
// open loop (arrivals at a rate, however many are in flight), on gRPC's callback API.
//
// Thread-safety: Run() is called once, from one thread. The calls' reactors run on gRPC's
// threads and only touch the runner under its mutex (see Note [Who deletes a call] in
// bench_load.cpp).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bench_record.h"
#include "connection.h"
#include "qpool/v1/qpool.grpc.pb.h"

namespace qpool::cli {

using BenchClock = std::chrono::steady_clock;

enum class Arrivals {
  kPoisson,  // exponentially distributed gaps: independent users
  kUniform,  // equal gaps of 1 / rate
};

struct LoadOptions {
  // Closed loop: requests kept in flight. Ignored when rate > 0.
  uint64_t concurrency = 8;
  // Open loop when > 0: requests per second, sent on schedule whatever is in flight.
  double rate = 0;
  Arrivals arrivals = Arrivals::kPoisson;
  // The warm-up, not counted: the first warmup_requests requests, or those due in the first
  // warmup_seconds. The load goes on without a pause, so the measured window starts warm.
  uint64_t warmup_requests = 0;
  double warmup_seconds = 0;
  // Measured requests to send, and/or seconds to send them for (from the end of the warm-up);
  // whichever ends first. Requests in flight at the end are waited for and counted.
  std::optional<uint64_t> requests;
  std::optional<double> duration_seconds;
  uint64_t arrival_seed = 0;  // the Poisson gaps, for repeatable runs
};

// ClientContext::peer() of a finished call when it names the server that answered (a transport
// address such as "ipv4:10.1.2.3:50051"), else "": a call that failed before it was sent reports
// the channel's target instead.
std::string AnsweringPeer(const grpc::ClientContext& context);

// What to send as request `n`: the message, its mix entry and its deadline.
struct PlannedRequest {
  v1::GenerateRequest request;
  std::string template_name;
  std::optional<double> deadline_seconds;  // none: the call has no deadline
};
using RequestSource = std::function<PlannedRequest(uint64_t n)>;

class LoadRunner {
 public:
  // `origin` is time 0 of the records. `stop` (may be null) counts stop requests (signals):
  // at 1 no new request is sent, at 2 the ones in flight are cancelled too.
  LoadRunner(const Connection& connection, LoadOptions options, RequestSource source,
             BenchClock::time_point origin, const std::atomic<int>* stop);
  ~LoadRunner();
  LoadRunner(const LoadRunner&) = delete;
  LoadRunner& operator=(const LoadRunner&) = delete;

  // Sends the load and waits for every call; returns one record per request in index order.
  std::vector<RequestRecord> Run();

 private:
  class Call;

  double Now() const;
  // Whether request `n`, due at `due_s`, is still to be sent (and if it is warm-up).
  bool ShouldSend(uint64_t n, double due_s, bool* warmup);
  void Send(uint64_t n, double due_s, bool warmup);
  // Called by a Call's OnDone: stores its record and queues it for deletion.
  void Finished(Call* call, RequestRecord record);
  // Deletes finished calls; call with mutex_ held.
  void ReapLocked(std::unique_lock<std::mutex>& lock);

  const Connection& connection_;
  const LoadOptions options_;
  const RequestSource source_;
  const BenchClock::time_point origin_;
  const std::atomic<int>* stop_;
  std::unique_ptr<v1::InferenceService::Stub> stub_;

  uint64_t measured_sent_ = 0;
  double measure_start_s_ = -1;  // due time of the first measured request

  std::mutex mutex_;  // guards everything below
  std::condition_variable changed_;
  std::vector<Call*> in_flight_;
  std::vector<Call*> finished_;
  std::vector<RequestRecord> records_;
};

}  // namespace qpool::cli
