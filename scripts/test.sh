#!/usr/bin/env bash
# The whole test suite: set-up, build, then every tier through CTest (unit, integration, and the
# GPU tests, which skip without a GPU). Extra arguments go to ctest, e.g. `-L unit`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
cd "${QPOOL_BUILD_DIR:-$root/build}"
ctest --output-on-failure -j "${QPOOL_TEST_JOBS:-2}" "$@"
