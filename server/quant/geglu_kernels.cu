#include "quant/geglu_kernels.h"
#include "quant/halves_kernel.cuh"

namespace qpool::quant::cuda {
namespace {

// value * gelu(gate): the first half is the value, the second the gate.
template <typename T>
struct Geglu {
  __device__ __forceinline__ T operator()(T value, T gate, int64_t) const {
    return GegluValue(value, gate);
  }
};

}  // namespace

void LaunchGeglu(const void* x, int64_t stride_x, int64_t rows, int64_t d, void* out, ElemType type,
                 cudaStream_t stream) {
  WithElemType(type, [&](auto zero) {
    using T = decltype(zero);
    LaunchHalves(static_cast<const T*>(x), stride_x, rows, d, static_cast<T*>(out), Geglu<T>{},
                 stream);
  });
}

}  // namespace qpool::quant::cuda
