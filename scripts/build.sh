#!/usr/bin/env bash
# Configures and builds qpool into build/ (Release) against the LibTorch of .venv's PyTorch wheel.
# Usage: scripts/build.sh [extra cmake args...]   Env: QPOOL_BUILD_DIR, QPOOL_JOBS.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${QPOOL_BUILD_DIR:-$root/build}
. "$root/scripts/compiler-launcher.sh"
torch_cmake=$("$root/.venv/bin/python" -c 'import torch;print(torch.utils.cmake_prefix_path)')
export PATH="$PATH:/usr/local/cuda/bin"
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$torch_cmake" -DQPOOL_PYTHON="$root/.venv/bin/python" \
    ${launcher[@]+"${launcher[@]}"} "$@"
fi
cmake --build "$build" -j "${QPOOL_JOBS:-$(nproc)}"
