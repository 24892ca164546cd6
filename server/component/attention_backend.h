// Which fused kernel runs the pipelines' attention (Note [Attention backend]).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "util/status.h"

namespace qpool {

// Note [Attention backend]
// Every pipeline's attention is aten::scaled_dot_product_attention in its TorchScript graph.
// ATen picks the kernel at each call from a process-wide priority order over its backends
// (flash: FlashAttention-2; efficient: memory-efficient attention; math: unfused; cudnn: cuDNN's
// fused attention; overrideable: a registered third-party one), taking the first whose
// constraints the call meets (head size, dtype, layout, device). PyTorch's own order puts cuDNN
// after math. `--attention NAME` moves NAME to the front and keeps the others in the current
// order behind it, so a call NAME cannot take (cuDNN's head sizes stop at 128) runs what it ran
// before; `auto` changes nothing. The setting is ATen's, hence the process's: it is applied once
// at start, before any pipeline runs. A compiled component (Note [Compiled forward]) had its
// attention kernel chosen when it was compiled and is not affected.

// `current` (ATen's at::SDPBackend values, a permutation) with the backend `name` (flash, cudnn,
// efficient or math) moved to the front; `current` itself for "auto". InvalidArgument for
// another name, or a `current` that lacks the backend.
StatusOr<std::vector<int64_t>> AttentionPriority(const std::string& name,
                                                 const std::vector<int64_t>& current);

// "cudnn, flash, efficient, math, overrideable": an order as names, for logs.
std::string DescribeAttentionPriority(const std::vector<int64_t>& order);

// ATen's priority order now.
std::vector<int64_t> CurrentAttentionPriority();

// Sets ATen's order for `name` (AttentionPriority of the current one) and returns the order set.
StatusOr<std::vector<int64_t>> ApplyAttentionBackend(const std::string& name);

}  // namespace qpool
