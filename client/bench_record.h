// What `qpool bench` measures, as plain structs: one row per request and one per memory
// observation. The load runner and the memory monitor fill them; statistics and reports read
// them. No gRPC or protobuf types here, so the pure parts of the bench test without a server.
#pragma once

#include <cstdint>
#include <string>

namespace qpool::cli {

// One Generate call as the client saw it. Times are seconds since the run's origin (the
// moment the first request was due), on the monotonic clock.
struct RequestRecord {
  uint64_t index = 0;         // 0, 1, ... in order of scheduling (warm-up requests first)
  bool warmup = false;        // sent during --warmup: reported, not counted
  std::string template_name;  // the mix entry it came from
  std::string pipeline;
  double scheduled_s = 0;        // when it was due: the open loop's arrival, else the send
  double start_s = 0;            // when the call was started
  double first_progress_s = -1;  // first Progress message; < 0 when none arrived
  double end_s = 0;              // the status arrived
  std::string code;              // gRPC status code name: "OK", "NOT_FOUND", ...
  std::string error;             // the status message of a failed call
  std::string device;            // GenerateResult.device: the replica that ran it
  std::string route;             // GenerateResult.route: why that replica
  std::string peer;              // the server address that answered (ClientContext::peer())
  uint32_t images = 0;
  uint32_t batch_size = 0;    // GenerateResult.batch_size; 0 when unknown
  double queue_s = 0;         // GenerateResult.timings.queue_seconds
  double server_total_s = 0;  // GenerateResult.timings.total_seconds

  bool ok() const { return code == "OK"; }
  // From the scheduled time, so that a sender running late (coordinated omission) still shows
  // up in the latency.
  double latency_s() const { return end_s - scheduled_s; }
  // Time to the first Progress message from the scheduled time; < 0 when none arrived.
  double first_progress_latency_s() const {
    return first_progress_s < 0 ? -1 : first_progress_s - scheduled_s;
  }
};

// One point of the memory timeline: a periodic GetMemoryReport sample of one device, or a
// WatchMemory event (load, offload, oom, ...) with the device counters after it.
struct MemoryPoint {
  double time_s = 0;  // seconds since the run's origin
  std::string peer;   // the server address that answered; a Service has one per pod
  std::string device;
  std::string kind;  // "sample", or the event's kind
  uint64_t allocated_bytes = 0;
  uint64_t reserved_bytes = 0;
  uint64_t total_bytes = 0;  // device capacity; 0 for cpu and for events
  std::string pipeline;      // events: the pipeline concerned
  std::string detail;        // events: component, outcome and message

  bool is_sample() const { return kind == "sample"; }
};

}  // namespace qpool::cli
