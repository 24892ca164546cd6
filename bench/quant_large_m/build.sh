#!/bin/bash
# Builds this checkout's quant kernels, the sm_90a large-M kernel included, with the shim's
# extern "C" entry points into libqk_large.so for harness.py (a GPU with compute capability 9.0).
# Usage: bench/quant_large_m/build.sh; then python3 bench/quant_large_m/harness.py [check|bench|all].
set -e
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
PY=${PYTHON:-python3}
[ -x "$ROOT/.venv/bin/python" ] && PY="$ROOT/.venv/bin/python"
TORCH=${TORCH_DIR:-$($PY -c 'import torch,os;print(os.path.dirname(torch.__file__))')}
F="-std=c++17 -O3 -lineinfo -Xcompiler -fPIC -Xcompiler -fvisibility=hidden -D_GLIBCXX_USE_CXX11_ABI=1
   -I $TORCH/include -I $TORCH/include/torch/csrc/api/include -I $ROOT/server"
B="$HERE/build"
rm -rf "$B" && mkdir -p "$B"
objs=()
for cu in "$ROOT"/server/quant/*.cu; do
  nvcc $F -gencode=arch=compute_90,code=sm_90 -c "$cu" -o "$B/$(basename "$cu" .cu).o" &
  objs+=("$B/$(basename "$cu" .cu).o")
done
for cu in "$ROOT"/server/quant/sm90/*.cu; do
  nvcc $F -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -c "$cu" -o "$B/$(basename "$cu" .cu).o" \
    2> "$B/$(basename "$cu" .cu).ptxas.txt" &
  objs+=("$B/$(basename "$cu" .cu).o")
done
nvcc $F -gencode=arch=compute_90,code=sm_90 -Xcompiler -fvisibility=default -c "$HERE/shim.cu" -o "$B/shim.o" &
wait
nvcc -shared -o "$HERE/libqk_large.so" "${objs[@]}" "$B/shim.o" -L "$TORCH/lib" -lc10 -lc10_cuda -lcudart_static
grep -hE "registers|spill" "$B"/*.ptxas.txt | paste - - | sed 's/ptxas info *: //' | head -20
