#!/bin/bash
# Builds the kernels of this checkout (libqk_new.so) and of git revision $BASE_REV (default main,
# libqk_old.so) as plain shared libraries for sm_90, with the shim's extern "C" entry points.
# Usage: bench/quant_small_m/build.sh [BASE_REV]; then python3 bench/quant_small_m/harness.py.
set -e
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BASE_REV=${1:-main}
TORCH=${TORCH_DIR:-$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')}
F="-std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -Xcompiler -fPIC -Xcompiler -fvisibility=hidden
   -D_GLIBCXX_USE_CXX11_ABI=1 -I $TORCH/include -I $TORCH/include/torch/csrc/api/include"
BUILD="$HERE/build"
rm -rf "$BUILD" && mkdir -p "$BUILD/new/quant" "$BUILD/old/quant"
for f in quant_mma_kernels.cu quant_kernels.cu quant_kernel_common.cuh quant_kernels.h; do
  cp "$ROOT/server/quant/$f" "$BUILD/new/quant/$f"
  git -C "$ROOT" show "$BASE_REV:server/quant/$f" > "$BUILD/old/quant/$f"
done
for v in new old; do
  D=""; [ $v = old ] && D="-DQK_OLD"
  nvcc $F -I "$BUILD/$v" -Xptxas -v -c "$BUILD/$v/quant/quant_mma_kernels.cu" -o "$BUILD/$v/mma.o" \
    2> "$BUILD/$v/ptxas.txt" &
  nvcc $F -I "$BUILD/$v" -c "$BUILD/$v/quant/quant_kernels.cu" -o "$BUILD/$v/k.o" &
  nvcc $F -I "$BUILD/$v" $D -Xcompiler -fvisibility=default -c "$HERE/shim.cu" -o "$BUILD/$v/shim.o" &
done
wait
for v in new old; do
  nvcc -shared -o "$HERE/libqk_$v.so" "$BUILD/$v/mma.o" "$BUILD/$v/k.o" "$BUILD/$v/shim.o" \
    -L "$TORCH/lib" -lc10 -lc10_cuda -lcudart_static
done
grep -E "registers|spill" "$BUILD/new/ptxas.txt" | paste - - | head -12
