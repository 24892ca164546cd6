// Residency: where one component's tensors are. The single source of truth; nothing infers it
// from hooks or tensor devices.
#pragma once

#include <c10/core/Device.h>

#include "util/status.h"

namespace qpool {

// kUnloaded: no tensors. kHost: the host copy only (pinned for GPU pipelines). kDevice: on a
// device (the host copy may be kept as well, see Note [The host copy is the master]).
// kStreaming: the host copy is the component's; while it runs, its groups come to the device and
// go a few at a time (Note [Streaming] in residency/stream_plan.h).
enum class Residency { kUnloaded, kHost, kDevice, kStreaming };

const char* ResidencyName(Residency residency);

// Whether a component may go from (from, from_device) to (to, to_device):
//   unloaded -> host (place)          host -> device (onload)      device -> host (offload)
//   device(a) -> device(b), a != b (move)                          any -> unloaded (unload)
//   host -> streaming(device) (a streamed run)                     streaming -> host
// Staying where it is is allowed (nothing moves). FailedPrecondition naming the component and
// both states otherwise, e.g. onloading an unloaded component or moving an offloaded one.
Status CheckTransition(const std::string& component, Residency from, const c10::Device& from_device,
                       Residency to, const c10::Device& to_device);

}  // namespace qpool
