#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (ASan, LSan, UBSan) and runs each for a while
# over a fresh copy of its seed corpus. Fails if any target crashes, leaks, times out on an input
# or runs out of memory; the input that did it is kept (fuzz/README.md).
# Usage: scripts/fuzz.sh [target...]   (default: every target; fuzz_component only where the
#        PyTorch wheel of .venv is found, as scripts/setup.sh installs it)
# Env: QPOOL_FUZZ_BUILD_DIR (default build-fuzz), QPOOL_FUZZ_SECONDS per target (default 30),
#      QPOOL_FUZZ_ARGS extra libFuzzer flags (e.g. "-max_len=16384"), QPOOL_JOBS build jobs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${QPOOL_FUZZ_BUILD_DIR:-$root/build-fuzz}
seconds=${QPOOL_FUZZ_SECONDS:-30}
all=(fuzz_manifest fuzz_clip_tokenizer fuzz_server_options fuzz_token_file fuzz_requests
     fuzz_tls_files fuzz_archive_bounds fuzz_bpe_tokenizer)
torch_targets=(fuzz_component)  # need LibTorch (fuzz/CMakeLists.txt)

for tool in clang clang++; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "fuzz: $tool not found; scripts/setup.sh installs clang (libFuzzer comes with it)" >&2
    exit 1
  fi
done
# LibTorch for torch_targets: the PyTorch wheel of .venv, as scripts/build.sh finds it.
torch_cmake=
if [ -x "$root/.venv/bin/python" ]; then
  torch_cmake=$("$root/.venv/bin/python" -c 'import torch;print(torch.utils.cmake_prefix_path)' \
    2>/dev/null || true)
fi
. "$root/scripts/compiler-launcher.sh"
has_torch() { grep -q '^QPOOL_FUZZ_TORCH:INTERNAL=ON$' "$build/CMakeCache.txt" 2>/dev/null; }
if [ ! -f "$build/build.ninja" ] || { [ -n "$torch_cmake" ] && ! has_torch; }; then
  CC=clang CXX=clang++ cmake -S "$root/fuzz" -B "$build" -G Ninja \
    ${torch_cmake:+-DCMAKE_PREFIX_PATH="$torch_cmake"} ${launcher[@]+"${launcher[@]}"} >/dev/null
fi
if has_torch; then
  all+=("${torch_targets[@]}")
else
  echo "fuzz: no PyTorch in $root/.venv: ${torch_targets[*]} not built" >&2
fi
targets=("${all[@]}")
if (($#)); then targets=("$@"); fi
for target in "${targets[@]}"; do
  if [[ ! " ${all[*]} " == *" $target "* ]]; then
    echo "fuzz: no target $target here (targets: ${all[*]})" >&2
    exit 1
  fi
done
start=$SECONDS
cmake --build "$build" -j "${QPOOL_JOBS:-$(nproc)}" --target "${targets[@]}"
echo "fuzz: built ${#targets[@]} target(s) in $((SECONDS - start)) s"

# Each run's inputs, logs and findings: $build/runs/<target>/{corpus,log,findings}.
failed=()
for target in "${targets[@]}"; do
  seeds=$root/fuzz/corpus/$target
  run=$build/runs/$target
  rm -rf "$run"
  mkdir -p "$run/findings"
  cp -r "$seeds" "$run/corpus"
  status=0
  # The outer timeout: libFuzzer's own (-timeout) reports from a signal handler, which deadlocks
  # when the alarm interrupts malloc; a run that outlives its time by 2 minutes is stopped.
  # shellcheck disable=SC2086  # QPOOL_FUZZ_ARGS is a list of flags
  timeout -k 10 $((seconds + 120)) \
    "$build/$target" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$run/findings/" ${QPOOL_FUZZ_ARGS:-} \
    "$run/corpus" >"$run/log" 2>&1 || status=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$run/log" | tail -n 1)
  cov=$(grep -o ' cov: [0-9]*' "$run/log" | tail -n 1 | tr -dc '0-9')
  corpus=$(find "$run/corpus" -type f | wc -l)
  if [ "$status" -eq 0 ]; then
    echo "fuzz: $target ok: ${execs:-?} executions in ${seconds} s, cov ${cov:-?}, corpus $corpus"
  else
    failed+=("$target")
    echo "fuzz: $target FAILED (exit $status) after ${execs:-?} executions; log $run/log" >&2
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
      echo "fuzz: $target did not stop: an input hung and libFuzzer's report of it hung too;" \
        "the input's bytes follow 'ALARM' in the log" >&2
    fi
    grep -E '^==[0-9]+==ERROR|SUMMARY|FUZZ_CHECK|runtime error|ALARM|out-of-memory' "$run/log" \
      | head -n 20 >&2 || true
    for input in "$run"/findings/*; do
      [ -e "$input" ] && echo "fuzz: $target input: $input" >&2
    done
    tail -n 60 "$run/log" >&2
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: failed: ${failed[*]}; keep each input under fuzz/findings/<target>/ (README)" >&2
  exit 1
fi
echo "fuzz: ok (${#targets[@]} target(s), ${seconds} s each)"
