#include "memory/arena_allocator.h"

#include <ATen/Context.h>
#include <c10/core/InferenceMode.h>
#if QPOOL_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include <cstdlib>

#include "util/log.h"

namespace qpool {
namespace {

constexpr size_t kHostAlignment = 4096;

#if QPOOL_WITH_CUDA
uint64_t AllocatedOn(int index) {
  const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return static_cast<uint64_t>(
      c10::cuda::CUDACachingAllocator::getDeviceStats(index).allocated_bytes[agg].current);
}

void FreePinned(void* p) { cudaFreeHost(p); }
#else
void FreePinned(void*) {}  // never allocated: Allocate refuses pinned memory without CUDA
#endif

bool IsOutOfMemory(const c10::Error& e) {
  return std::string(e.what()).find("out of memory") != std::string::npos;
}

}  // namespace

ArenaAllocator::ArenaAllocator() : counters_(std::make_shared<Counters>()) {}

StatusOr<ArenaBlock> ArenaAllocator::Allocate(const c10::Device& device, uint64_t size,
                                              bool pinned) {
  const uint64_t n = std::max<uint64_t>(size, 1);
  // Blocks are normal tensors even when a worker (in InferenceMode) allocates them, so that
  // packing and copying into them is allowed anywhere.
  c10::InferenceMode normal(false);
  ArenaBlock block;
  if (device.is_cpu()) {
    void* ptr = nullptr;
    if (pinned) {
      if (!at::globalContext().hasCUDA()) {
        return FailedPrecondition("pinned host memory needs a CUDA device");
      }
#if QPOOL_WITH_CUDA
      if (cudaHostAlloc(&ptr, n, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        return ResourceExhausted(StrCat("cannot allocate ", n, " bytes of pinned host memory"));
      }
#endif
    } else {
      ptr = std::aligned_alloc(kHostAlignment,
                               (n + kHostAlignment - 1) / kHostAlignment * kHostAlignment);
      if (ptr == nullptr) {
        return ResourceExhausted(StrCat("cannot allocate ", n, " bytes of host memory"));
      }
    }
    auto counters = counters_;
    counters->cpu += n;
    if (pinned) counters->pinned += n;
    block.bytes = torch::from_blob(
        ptr, {static_cast<int64_t>(n)},
        [counters, n, pinned](void* p) {
          counters->cpu -= n;
          if (pinned) {
            counters->pinned -= n;
            FreePinned(p);
          } else {
            std::free(p);
          }
        },
        torch::TensorOptions().dtype(torch::kUInt8).device(c10::kCPU));
    block.allocator_bytes = n;
    return block;
  }
  try {
    const auto options = torch::TensorOptions().dtype(torch::kUInt8).device(device);
#if QPOOL_WITH_CUDA
    if (device.is_cuda()) {
      c10::cuda::CUDAGuard guard(device);
      const uint64_t before = AllocatedOn(device.index());
      block.bytes = torch::empty({static_cast<int64_t>(n)}, options);
      block.allocator_bytes = AllocatedOn(device.index()) - before;
      return block;
    }
#endif
    block.bytes = torch::empty({static_cast<int64_t>(n)}, options);
    block.allocator_bytes = 0;  // meta and other devices hold no memory we account
  } catch (const c10::Error& e) {
    std::string msg =
        StrCat("cannot allocate ", n, " bytes on ", device.str(), ": ", e.what_without_backtrace());
    return IsOutOfMemory(e) ? ResourceExhausted(msg) : Internal(msg);
  }
  return block;
}

}  // namespace qpool
