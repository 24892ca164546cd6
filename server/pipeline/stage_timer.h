// StageTimer: when a request's stages ended, as the device saw them.
#pragma once

#include <c10/core/Device.h>
#include <c10/core/Event.h>

#include <chrono>
#include <cstddef>
#include <vector>

namespace qpool {

// Note [Stage timings]
// A GPU runs what the host queued later than the host queued it: a denoising loop of replayed
// graphs is queued in a few milliseconds and runs for hundreds. So the boundaries between a
// request's stages are events on the device's current stream, and a stage's time is the time
// between the moments the device reached its two boundaries. The host's gaps (tokenizing,
// waiting for a copy) count where the device waited for them, so the stages of a request add
// up to the time its batch ran. On the CPU the host's clock is the device's.
//
// Thread safety: none; the worker running a batch owns its timer.
class StageTimer {
 public:
  explicit StageTimer(c10::Device device);

  // Marks a boundary on the device's current stream (on the CPU, now) and returns its index.
  size_t Mark();
  // Seconds from boundary `from` to boundary `to`; waits until the device has passed `to`.
  double Seconds(size_t from, size_t to) const;

 private:
  c10::Device device_;
  std::vector<c10::Event> events_;                          // GPU boundaries
  std::vector<std::chrono::steady_clock::time_point> now_;  // CPU boundaries
};

}  // namespace qpool
