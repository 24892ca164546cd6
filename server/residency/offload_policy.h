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
// Layer-wise streaming (sequential/group offload) is not built yet; manifests asking for it are
// refused at load.
enum class OffloadMode { kNone, kModel, kIdle };

struct OffloadPolicy {
  OffloadMode mode = OffloadMode::kNone;
  double idle_seconds = 300;  // kIdle only
};

// "none", "model" or "idle"; InvalidArgument for other names or idle_seconds outside (0, 1 week].
StatusOr<OffloadPolicy> MakeOffloadPolicy(const std::string& name, double idle_seconds);
const char* OffloadModeName(OffloadMode mode);

}  // namespace qpool
