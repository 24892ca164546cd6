// extern "C" entry points over the torch-free kernel interface (server/quant/quant_kernels.h) for
// harness.py (ctypes).
#include <cstdio>
#include <c10/util/Exception.h>
#include "quant/quant_kernels.h"
using namespace qpool::quant::cuda;
#define GUARD(body) try { body; return 0; } catch (const std::exception& e) { fprintf(stderr, "qk error: %s\n", e.what()); return 1; }
extern "C" {
int qk_fused(const PackedWeightView* w, const void* x, long m, const void* bias, void* out, int type, void* stream) {
  GUARD(LaunchFusedLinear(*w, x, m, bias, out, static_cast<ElemType>(type), (cudaStream_t)stream))
}
int qk_dequant(const PackedWeightView* w, void* out, int type, void* stream) {
  GUARD(LaunchDequantize(*w, out, static_cast<ElemType>(type), (cudaStream_t)stream))
}
int qk_supported(const PackedWeightView* w, const void* x, long m, int type) {
  return MmaLinearSupported(*w, x, m, static_cast<ElemType>(type)) ? 1 : 0;
}
int qk_mma(const PackedWeightView* w, const void* x, long m, const void* bias, void* out, int type, int sms, int clusters, void* stream) {
  MmaDevice d; d.sm_count = sms; d.clusters = clusters != 0;
  GUARD(LaunchMmaLinear(*w, x, m, bias, out, static_cast<ElemType>(type), d, (cudaStream_t)stream))
}
}
#ifndef QK_NO_SHAPE  // a base revision without MmaDevice::shape
extern "C" int qk_mma_shape(const PackedWeightView* w, const void* x, long m, const void* bias, void* out, int type, int sms, int clusters, int tiles, int splits, void* stream) {
  MmaDevice d; d.sm_count = sms; d.clusters = clusters != 0; d.shape.tiles = tiles; d.shape.splits = splits;
  GUARD(LaunchMmaLinear(*w, x, m, bias, out, static_cast<ElemType>(type), d, (cudaStream_t)stream))
}
extern "C" int qk_mma_plan(const PackedWeightView* w, long m, int type, int sms, int clusters, int tiles, int splits, long* plan) {
  MmaDevice d; d.sm_count = sms; d.clusters = clusters != 0; d.shape.tiles = tiles; d.shape.splits = splits;
  GUARD({ const MmaPlan p = PlanMmaLinear(*w, m, static_cast<ElemType>(type), d);
          plan[0] = p.tiles; plan[1] = p.splits; plan[2] = p.blocks; plan[3] = p.blocks_per_sm; })
}
#endif
