#!/bin/bash
# Builds the kernels of this checkout (libqk_new.so) and of git revision $BASE_REV (default main,
# libqk_old.so) as plain shared libraries for sm_90, with the shim's extern "C" entry points.
# Usage: bench/quant_small_m/build.sh [BASE_REV]; then python3 bench/quant_small_m/harness.py.
# More builds of the same interface, e.g. an experiment: build_lib NAME DIR after sourcing this
# file with NO_MAIN=1 (harness.py times every libqk_*.so beside it besides libqk_old.so).
set -e
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BASE_REV=${1:-main}
TORCH=${TORCH_DIR:-$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')}
F="-std=c++17 -O3 -gencode=arch=compute_90,code=sm_90 -Xcompiler -fPIC -Xcompiler -fvisibility=hidden
   -D_GLIBCXX_USE_CXX11_ABI=1 -I $TORCH/include -I $TORCH/include/torch/csrc/api/include"
BUILD="$HERE/build"

# build_lib NAME DIR: compiles every DIR/quant/*.cu and the shim into libqk_NAME.so.
build_lib() {
  local name=$1 dir=$2 objs=()
  for cu in "$dir"/quant/*.cu; do
    local o="$dir/$(basename "$cu" .cu).o"
    nvcc $F -I "$dir" -Xptxas -v -c "$cu" -o "$o" 2> "$dir/$(basename "$cu" .cu).ptxas.txt" &
    objs+=("$o")
  done
  local shim_flags=""
  grep -q "MmaShape shape" "$dir/quant/quant_kernels.h" || shim_flags="-DQK_NO_SHAPE"
  nvcc $F $shim_flags -I "$dir" -Xcompiler -fvisibility=default -c "$HERE/shim.cu" -o "$dir/shim.o" &
  wait
  nvcc -shared -o "$HERE/libqk_$name.so" "${objs[@]}" "$dir/shim.o" \
    -L "$TORCH/lib" -lc10 -lc10_cuda -lcudart_static
}

if [ -z "$NO_MAIN" ]; then
  rm -rf "$BUILD" && mkdir -p "$BUILD/new/quant" "$BUILD/old/quant"
  cp "$ROOT"/server/quant/*.cu "$ROOT"/server/quant/*.cuh "$ROOT"/server/quant/*.h "$BUILD/new/quant/"
  for f in $(git -C "$ROOT" ls-tree --name-only "$BASE_REV" server/quant/); do
    case "$f" in
      *.cu | *.cuh | *.h) git -C "$ROOT" show "$BASE_REV:$f" > "$BUILD/old/quant/$(basename "$f")" ;;
    esac
  done
  build_lib new "$BUILD/new" &
  build_lib old "$BUILD/old" &
  wait
  grep -hE "registers|spill" "$BUILD"/new/*.ptxas.txt | paste - - | head -40
fi
