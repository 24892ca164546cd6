// extern "C" entry points over the torch-free kernel interface (server/quant/quant_kernels.h) for
// harness.py (ctypes).
#include <cstdio>
#include <c10/util/Exception.h>
#include "quant/quant_kernels.h"
using namespace qpool::quant::cuda;
#define GUARD(body) try { body; return 0; } catch (const std::exception& e) { fprintf(stderr, "qk error: %s\n", e.what()); return 1; }
extern "C" {
int qk_dequant(const PackedWeightView* w, void* out, int type, void* stream) {
  GUARD(LaunchDequantize(*w, out, static_cast<ElemType>(type), (cudaStream_t)stream))
}
int qk_wgmma_supported(const PackedWeightView* w, const void* x, long m, int type) {
  try { return WgmmaLinearSupported(*w, x, m, static_cast<ElemType>(type)) ? 1 : 0; } catch (...) { return -1; }
}
static WgmmaTile Tile(int rows, int sm_count, int schedule) {
  WgmmaTile tile; tile.rows = rows; tile.sm_count = sm_count; tile.schedule = static_cast<WgmmaSchedule>(schedule);
  return tile;
}
long qk_wgmma_workspace(const PackedWeightView* w, long m, int rows, int sm_count, int schedule) {
  const WgmmaTile tile = Tile(rows, sm_count, schedule);
  try { return WgmmaWorkspaceBytes(*w, m, tile); } catch (...) { return -1; }
}
int qk_wgmma(const PackedWeightView* w, const void* x, long m, const void* bias, void* out, int type, int rows, int sm_count, int schedule, void* workspace, void* stream) {
  const WgmmaTile tile = Tile(rows, sm_count, schedule);
  GUARD(LaunchWgmmaLinear(*w, x, m, bias, out, static_cast<ElemType>(type), tile, workspace, (cudaStream_t)stream))
}
}
