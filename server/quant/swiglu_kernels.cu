#include "quant/halves_kernel.cuh"
#include "quant/swiglu_kernels.h"

namespace qpool::quant::cuda {
namespace {

// silu(gate) * value (* weight[row]): the first half is the gate, the second the value; each step
// rounded to T as the unfused ATen operations round it (Note [SwiGLU op]).
template <typename T>
struct Swiglu {
  const T* weight;  // [rows], or null

  __device__ __forceinline__ T operator()(T gate, T value, int64_t row) const {
    const float g = ToFloat(gate);
    const T silu = FromFloat<T>(g / (1.f + expf(-g)));
    const T product = FromFloat<T>(ToFloat(silu) * ToFloat(value));
    return weight == nullptr ? product : FromFloat<T>(ToFloat(product) * ToFloat(weight[row]));
  }
};

}  // namespace

void LaunchSwiglu(const void* x, int64_t stride_x, const void* weight, int64_t rows, int64_t d,
                  void* out, ElemType type, cudaStream_t stream) {
  WithElemType(type, [&](auto zero) {
    using T = decltype(zero);
    LaunchHalves(static_cast<const T*>(x), stride_x, rows, d, static_cast<T*>(out),
                 Swiglu<T>{static_cast<const T*>(weight)}, stream);
  });
}

}  // namespace qpool::quant::cuda
