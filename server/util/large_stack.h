// Running a call on a thread of its own with a stack of a given size.
#pragma once

#include <cstddef>
#include <functional>

#include "util/status.h"

namespace qpool {

// Runs `fn` on a new thread whose stack is `bytes` long (reserved, and committed only as it is
// used) and waits for it to return. For code that recurses as deep as its input, such as
// LibTorch's TorchScript compiler (Note [Script source limits] in component/). `fn` must not
// throw. Internal if the thread cannot be started (then `fn` did not run).
Status RunWithStack(size_t bytes, const std::function<void()>& fn);

}  // namespace qpool
