// Wall-clock durations for timings, events and metrics.
#pragma once

#include <chrono>

namespace qpool {

// Seconds elapsed on the steady clock since `start`.
inline double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace qpool
