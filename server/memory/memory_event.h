// MemoryEvent: what one load, unload, offload, onload, move, streamed run, empty-cache, OOM or
// leak check did to a device's memory.
#pragma once

#include <cstdint>
#include <string>

namespace qpool {

// kStream: one component's streamed run under the sequential policy (Note [Streaming]): its
// message says how many bytes were copied and the most held on the device at once.
enum class MemoryEventKind {
  kLoad,
  kUnload,
  kOffload,
  kOnload,
  kMove,
  kEmptyCache,
  kOom,
  kLeak,
  kStream  // the last: MemoryMetrics creates a series for each kind up to this one
};
enum class MemoryEventOutcome { kOk, kError, kLeak };

struct MemoryEvent {
  uint64_t sequence = 0;   // assigned by MemoryEventLog::Append: 1, 2, ...
  int64_t unix_nanos = 0;  // assigned by Append when 0
  MemoryEventKind kind = MemoryEventKind::kLoad;
  std::string pipeline;
  std::string component;    // empty: the whole pipeline
  std::string device;       // the device whose counters are reported
  std::string from_device;  // moves; "host" for the pinned host copy
  std::string to_device;
  uint64_t allocated_before = 0;
  uint64_t allocated_after = 0;
  uint64_t reserved_before = 0;
  uint64_t reserved_after = 0;
  int64_t attributed_delta = 0;  // change of the pipeline's attributed bytes on `device`
  uint64_t copied_bytes = 0;     // stream: bytes copied from the host copy during the run
  uint64_t leaked_bytes = 0;     // leak: bytes the unload check found not given back
  double duration_seconds = 0;
  MemoryEventOutcome outcome = MemoryEventOutcome::kOk;
  std::string message;
};

const char* MemoryEventKindName(MemoryEventKind kind);
const char* MemoryEventOutcomeName(MemoryEventOutcome outcome);

}  // namespace qpool
