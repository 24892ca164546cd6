// Wall-clock durations for timings, events and metrics.
#pragma once

#include <chrono>
#include <cstdint>

namespace qpool {

// Seconds elapsed on the steady clock since `start`.
inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Nanoseconds on the steady clock, for "last used" stamps kept in atomics.
inline int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace qpool
