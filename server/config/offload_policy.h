// OffloadPolicy: where a pipeline's components live between and during requests.
#pragma once

#include <string>

#include "util/status.h"

namespace qpool {

// Note [Offload policies]
// kNone:  every component stays on the device.
// kModel: only the running component is on the device; the next one is copied from its pinned
//         host copy on a side stream while the current one computes, and every component is
//         back on the host when the request ends, whatever it ran (Generate, Encode alone, a
//         failed or cancelled request). The request executor drives this, not forward hooks, so
//         the last component is never left behind.
// kIdle:  like kNone while requests come; offloaded to the host after idle_seconds without one.
// kSequential: no component is ever whole on the device: while one runs, its tensors come from
//         pinned host memory in groups of at most group_mib, `prefetch` groups ahead, and each
//         group goes as soon as its module's forward has queued its work (Note [Streaming] in
//         residency/stream_plan.h), except the first groups that fit in resident_mib, which stay
//         until the component's run ends (the denoising loop copies them once, not every step).
//         Between requests nothing is on the device. For pipelines larger than the GPU; every
//         step streams what is not resident again, so it is bound by the host link. Planned at
//         load: a pipeline loaded under another policy cannot switch to it.
enum class OffloadMode { kNone, kModel, kIdle, kSequential };

// The sequential policy's settings.
struct StreamSettings {
  // 64 MiB makes a few dozen groups of an SD 1.5 UNet (a ResNet block or a transformer block
  // each): few enough that per-copy and per-op costs stay small, small enough that the groups in
  // flight take a few hundred MiB instead of the whole model.
  double group_mib = 64;
  int prefetch = 2;         // groups copied ahead of the running one
  double resident_mib = 0;  // groups kept on the device for a component's whole run
};

struct OffloadPolicy {
  OffloadMode mode = OffloadMode::kNone;
  double idle_seconds = 300;  // kIdle only
  StreamSettings stream;      // kSequential only
};

// Whether the pipeline rests on the host between requests under `mode`.
inline bool RestsOnHost(OffloadMode mode) {
  return mode == OffloadMode::kModel || mode == OffloadMode::kSequential;
}

// Limits of the sequential policy's settings.
inline constexpr double kMaxIdleSeconds = 7 * 24 * 3600;  // a week
inline constexpr double kMaxGroupMib = 65536;
inline constexpr int kMaxPrefetch = 16;
inline constexpr double kMaxResidentMib = 1 << 20;

// "none", "model", "idle" or "sequential"; InvalidArgument for other names, idle_seconds outside
// (0, 1 week], group_mib outside [0, kMaxGroupMib], prefetch outside [0, kMaxPrefetch] or
// resident_mib outside [0, kMaxResidentMib].
StatusOr<OffloadPolicy> MakeOffloadPolicy(const std::string& name, double idle_seconds,
                                          const StreamSettings& stream = {});
const char* OffloadModeName(OffloadMode mode);

}  // namespace qpool
