// For the GPU tests of qpool's custom CUDA ops: an op captured into a CUDA graph on a side stream
// (after one eager run, which does what must not happen inside a capture), its inputs changed in
// place, the graph replayed. GPU tier only (CUDA headers).
#pragma once

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <functional>

namespace qpool::testing {

// The output `op` captured, after `change_inputs` and one replay: what the op computes from the
// new inputs when the graph launched it.
inline at::Tensor ReplayedAfterChange(const std::function<at::Tensor()>& op,
                                      const std::function<void()>& change_inputs) {
  const at::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  at::Tensor captured;
  at::cuda::CUDAGraph graph;
  {
    c10::cuda::CUDAStreamGuard guard(side);
    op();
    graph.capture_begin();
    captured = op();
    graph.capture_end();
  }
  change_inputs();
  torch::cuda::synchronize();
  {
    c10::cuda::CUDAStreamGuard guard(side);
    graph.replay();
  }
  side.synchronize();
  return captured;
}

}  // namespace qpool::testing
