#!/usr/bin/env bash
# The CPU-only build (Note [CPU-only build] in CMakeLists.txt) on a machine that has the CUDA
# toolkit: configures <build>/cpu-only with QPOOL_CUDA=OFF, builds the server, the CLI and the
# unit tests of the code that has CUDA and CPU variants, runs those, then the integration tests
# that exercise generation, memory accounting and residency against the CPU-only binaries.
# Run after scripts/test.sh (it reuses that build's test model repository). Env: QPOOL_BUILD_DIR.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
main=${QPOOL_BUILD_DIR:-$root/build}
build=$main/cpu-only
. "$root/scripts/compiler-launcher.sh"
torch_cmake=$("$root/.venv/bin/python" -c 'import torch;print(torch.utils.cmake_prefix_path)')
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DQPOOL_CUDA=OFF \
    -DQPOOL_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="$torch_cmake" \
    -DQPOOL_PYTHON="$root/.venv/bin/python" ${launcher[@]+"${launcher[@]}"} >/dev/null
fi
grep -q "QPOOL_CUDA:BOOL=OFF" "$build/CMakeCache.txt"
unit=(graph_cache_test component_test quant_op_test pipeline_pool_test leak_check_test)
cmake --build "$build" -j "${QPOOL_JOBS:-$(nproc)}" --target qpool-server qpool \
  "${unit[@]/#/unit_}"
if ldd "$build/server/qpool-server" | grep -E "lib(torch|c10)_cuda"; then
  echo "check-cpu-only: the CPU-only server links CUDA LibTorch" >&2
  exit 1
fi
for t in "${unit[@]}"; do
  "$build/tests/unit_$t" --gtest_brief=1
done
cd "$root"
QPOOL_SERVER_BIN=$build/server/qpool-server QPOOL_CLI_BIN=$build/client/qpool \
  QPOOL_TEST_REPOSITORY=$main/test-models "$root/.venv/bin/python" -m pytest -q -p no:cacheprovider \
  tests/integration/test_generate.py tests/integration/test_memory.py \
  tests/integration/test_cli.py tests/integration/test_quantized.py
echo "check-cpu-only: ok"
