// Host helpers of the sm_90a kernels of this directory: tensor maps for their TMA loads and the
// check that this build's sm_90a image runs on the current device. Included by .cu files of
// this directory only.
#pragma once

#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <cuda.h>
#include <cudaTypedefs.h>

#include <atomic>
#include <cstdint>

namespace qpool::quant::cuda {

using EncodeTiledFn = PFN_cuTensorMapEncodeTiled_v12000;

inline EncodeTiledFn EncodeTiled() {
  static const EncodeTiledFn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    C10_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000,
                                                    cudaEnableDefault, &found));
    TORCH_CHECK(found == cudaDriverEntryPointSuccess && p != nullptr,
                "the CUDA driver has no cuTensorMapEncodeTiled");
    return reinterpret_cast<EncodeTiledFn>(p);
  }();
  return fn;
}

// 2-D row-major tensor map of [rows, cols] elements of `bytes_per` bytes, box [box_rows, box_cols].
// Boxes reaching past the tensor's end are filled with zeros (and still complete all their
// bytes on the load's mbarrier).
inline CUtensorMap TensorMap2d(const void* base, CUtensorMapDataType type, int bytes_per,
                               uint64_t rows, uint64_t cols, uint32_t box_rows, uint32_t box_cols,
                               CUtensorMapSwizzle swizzle) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols * bytes_per};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t elem_strides[2] = {1, 1};
  const CUresult r =
      EncodeTiled()(&map, type, 2, const_cast<void*>(base), dims, strides, box, elem_strides,
                    CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  TORCH_CHECK(r == CUDA_SUCCESS, "cuTensorMapEncodeTiled failed (", static_cast<int>(r), ")");
  return map;
}

// Note [sm_90a image]
// The kernels of this directory are compiled for sm_90a only, so any other device has no image
// of them: cudaFuncGetAttributes fails there, which is how callers learn to take another path.
// One cache per kernel family, answered once per device (the first 64 device ordinals).
class Sm90ImageCache {
 public:
  bool Loads(const void* kernel) {
    int device = 0;
    C10_CUDA_CHECK(cudaGetDevice(&device));
    const uint64_t bit = uint64_t{1} << (device % 64);
    if ((known_.load(std::memory_order_acquire) & bit) == 0) {
      cudaFuncAttributes attributes;
      const cudaError_t err = cudaFuncGetAttributes(&attributes, kernel);
      if (err == cudaSuccess && attributes.binaryVersion == 90) {
        yes_.fetch_or(bit, std::memory_order_release);
      } else {
        (void)cudaGetLastError();  // clear the sticky-free error of the failed query
      }
      known_.fetch_or(bit, std::memory_order_release);
    }
    return (yes_.load(std::memory_order_acquire) & bit) != 0;
  }

 private:
  std::atomic<uint64_t> known_{0}, yes_{0};
};

// Raises a kernel's dynamic shared memory limit to `bytes` on the current device, once per
// device (the first 64 ordinals); host-only, so it runs in the eager call before any capture.
class SmemLimit {
 public:
  void Ensure(const void* kernel, int bytes) {
    int device = 0;
    C10_CUDA_CHECK(cudaGetDevice(&device));
    const uint64_t bit = uint64_t{1} << (device % 64);
    if ((done_.load(std::memory_order_acquire) & bit) == 0) {
      C10_CUDA_CHECK(
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
      done_.fetch_or(bit, std::memory_order_release);
    }
  }

 private:
  std::atomic<uint64_t> done_{0};
};

}  // namespace qpool::quant::cuda
