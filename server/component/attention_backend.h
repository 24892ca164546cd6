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
// constraints the call meets (head size, dtype, layout, device). ATen settles its CUDA order at
// its first attention call, not before: where it prefers cuDNN's attention (compute capability
// 9.0 or 10.0 with a recent cuDNN: PyTorch 2.11's wheels ship 9.19, and an H200 ran cuDNN first)
// it then puts cuDNN first, replacing any order set earlier; elsewhere its order stays flash,
// efficient, math, cuDNN. So the server first makes that call on a device of its own
// (SettleAttentionOrder), then reads the order. `--attention NAME` moves NAME to the front and
// keeps the others in ATen's order behind it, so a call NAME cannot take (cuDNN's head sizes stop
// at 128) runs what it ran before; `auto` keeps ATen's. The setting is ATen's, hence the process's:
// it is applied once at start, before any pipeline runs, and the start log names the order. A
// compiled component (Note [Compiled forward]) had its attention kernel chosen when it was compiled
// and is not affected: the exporter compiles under the order this server would run (Note [Compiled
// attention] in tools/qpool_export/qpool_export/compile.py) and records it in the package, and a
// component warns when its CUDA package's order differs from the server's.

// `current` (ATen's at::SDPBackend values, a permutation) with the backend `name` (flash, cudnn,
// efficient or math) moved to the front; `current` itself for "auto". InvalidArgument for
// another name, or a `current` that lacks the backend.
StatusOr<std::vector<int64_t>> AttentionPriority(const std::string& name,
                                                 const std::vector<int64_t>& current);

// "cudnn, flash, efficient, math, overrideable": an order as names, for logs.
std::string DescribeAttentionPriority(const std::vector<int64_t>& order);

// Empty when a package compiled under the attention order `package` ("cudnn, flash, ...", as
// DescribeAttentionPriority writes it; empty: not recorded) runs the kernels the server's order
// `server` picks for TorchScript; otherwise why not, for a warning.
std::string CompiledAttentionMismatch(const std::string& package,
                                      const std::vector<int64_t>& server);

// ATen's priority order now.
std::vector<int64_t> CurrentAttentionPriority();

// Makes ATen settle its own CUDA order: one attention backend choice for a tiny input on CUDA
// device `cuda_device`, once per process. Only with a CUDA device.
void SettleAttentionOrder(int cuda_device);

// Sets ATen's order for `name` (AttentionPriority of the current one, settled first on CUDA
// device `cuda_device` unless it is negative: a server without a GPU) and returns the order set.
StatusOr<std::vector<int64_t>> ApplyAttentionBackend(const std::string& name, int cuda_device);

}  // namespace qpool
