#!/usr/bin/env bash
# The whole test suite: set-up, build, then every tier through CTest (unit, integration, and the
# GPU tests, which skip without a GPU). Extra arguments go to ctest, e.g. `-L unit`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
start=$SECONDS
"$root/scripts/setup.sh"
echo "test: set-up took $((SECONDS - start)) s"
phase=$SECONDS
"$root/scripts/build.sh"
echo "test: build took $((SECONDS - phase)) s"
cd "${QPOOL_BUILD_DIR:-$root/build}"
phase=$SECONDS
status=0
ctest --output-on-failure -j "${QPOOL_TEST_JOBS:-2}" "$@" || status=$?
echo "test: ctest took $((SECONDS - phase)) s"
exit $status
