// The memory of the machine qpool runs on, as its processes may use it.
#pragma once

#include <cstdint>

namespace qpool {

// Physical memory, or the cgroup's memory limit (v2 memory.max, v1 memory.limit_in_bytes) when
// that is lower, as in a container with a memory limit. 0 when neither can be read.
uint64_t HostMemoryBytes();

}  // namespace qpool
