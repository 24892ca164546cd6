#include "residency/block_copy.h"

#if QPOOL_WITH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace qpool {

// Without CUDA every copy is a host copy, finished when Copy returns (no event).
void PendingCopy::Wait() const {
  if (!event_) return;
#if QPOOL_WITH_CUDA
  c10::cuda::CUDAGuard guard(device_);
  static_cast<at::cuda::CUDAEvent*>(event_.get())
      ->block(c10::cuda::getCurrentCUDAStream(device_.index()));
#endif
}

void PendingCopy::Synchronize() const {
  if (!event_) return;
#if QPOOL_WITH_CUDA
  static_cast<at::cuda::CUDAEvent*>(event_.get())->synchronize();
#endif
}

StatusOr<PendingCopy> BlockCopier::Copy(const torch::Tensor& dst, const torch::Tensor& src) {
  if (dst.numel() != src.numel()) {
    return Internal(StrCat("block copy of ", src.numel(), " bytes into ", dst.numel()));
  }
  try {
    if (!dst.is_cuda() && !src.is_cuda()) {
      dst.copy_(src);
      return PendingCopy();
    }
#if QPOOL_WITH_CUDA
    const c10::Device device = dst.is_cuda() ? dst.device() : src.device();
    c10::cuda::CUDAGuard guard(device);
    std::shared_ptr<void> stream_holder;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& slot = streams_[device.index()];
      if (!slot) {
        slot = std::make_shared<c10::cuda::CUDAStream>(
            c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index()));
      }
      stream_holder = slot;
    }
    const auto& side = *static_cast<c10::cuda::CUDAStream*>(stream_holder.get());
    const auto compute = c10::cuda::getCurrentCUDAStream(device.index());
    at::cuda::CUDAEvent ready;
    ready.record(compute);
    ready.block(side);
    {
      c10::cuda::CUDAStreamGuard stream_guard(side);
      dst.copy_(src, /*non_blocking=*/true);
    }
    auto done = std::make_shared<at::cuda::CUDAEvent>();
    done->record(side);
    return PendingCopy(std::static_pointer_cast<void>(done), device);
#else
    return Internal("this server was built without CUDA");
#endif
  } catch (const c10::Error& e) {
    return Internal(StrCat("copying ", src.numel(), " bytes from ", src.device().str(), " to ",
                           dst.device().str(), " failed: ", e.what_without_backtrace()));
  }
}

}  // namespace qpool
