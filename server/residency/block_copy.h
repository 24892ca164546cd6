// BlockCopy: copies one arena block into another, on a side stream per GPU.
#pragma once

#include <torch/types.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "util/log.h"
#include "util/status.h"

namespace qpool {

// A copy that may still be running on a GPU's copy stream. Wait() makes the calling thread's
// current stream (the compute stream of the device worker) wait for it on the GPU, without
// blocking the host; Synchronize() blocks the host. Both are no-ops for finished copies.
class PendingCopy {
 public:
  PendingCopy() = default;
  explicit PendingCopy(std::shared_ptr<void> event, c10::Device device)
      : event_(std::move(event)), device_(device) {}
  bool pending() const { return event_ != nullptr; }
  void Wait() const;
  void Synchronize() const;

 private:
  std::shared_ptr<void> event_;  // at::cuda::CUDAEvent, type-erased to keep CUDA out of headers
  c10::Device device_{c10::kCPU};
};

// Note [Copy ordering]
// A copy to or from a GPU runs on that GPU's copy stream, after the work already queued on the
// caller's current (compute) stream, because the destination block may be memory the compute
// stream freed a moment ago. The blocks are not marked as used by the copy stream
// (recordStream): the caching allocator would then defer their frees until its next allocation on
// that device, and the allocated bytes that every memory event and the unload leak check read
// would lag behind. Instead, whoever holds a block keeps it until its copy is known to be done:
// ComponentResidency synchronizes a pending copy before it drops or reads from a block the copy
// touches, and a staged move synchronizes its copy when it is dropped. Host<->host and meta
// copies are plain synchronous copies. One large copy per component: every copy pays a fixed
// overhead, so a UNet's hundreds of tensors copied one by one would add launch time alone.
//
// Thread safety: Copy may be called from any thread.
class BlockCopier {
 public:
  // Copies `src` into `dst` (uint8 blocks of equal size). With a GPU on either side the copy is
  // asynchronous and the returned PendingCopy says when it is done.
  StatusOr<PendingCopy> Copy(const torch::Tensor& dst, const torch::Tensor& src);

 private:
  std::mutex mu_;
  std::map<int, std::shared_ptr<void>> streams_;  // c10::cuda::CUDAStream per device index
};

}  // namespace qpool
