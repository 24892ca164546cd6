// Eviction: which idle replicas to offload to make room on one device, least recently used
// first. A pure function, so it is unit-tested with made-up numbers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/status.h"

namespace qpool {

// A replica of another pipeline on the device that needs room.
struct EvictionCandidate {
  std::string pipeline;
  int replica = 0;            // the caller's index
  uint64_t bytes = 0;         // what an offload gives back on the device
  uint64_t last_used_ns = 0;  // steady clock; smaller = used longer ago
  bool idle = false;          // nothing in flight and not moving: only these are offloaded
};

// The idle candidates to offload, least recently used first (ties: pipeline name, then replica),
// stopping as soon as they free `needed` bytes; empty for needed == 0. ResourceExhausted, naming
// `needed` and what the idle replicas hold, when even all of them are not enough.
StatusOr<std::vector<EvictionCandidate>> PlanEviction(std::vector<EvictionCandidate> candidates,
                                                      uint64_t needed);

}  // namespace qpool
