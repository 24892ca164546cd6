#!/usr/bin/env bash
# Set-up, build, export the example pipeline "tiny" into models/, and serve it (GPU if there is
# one, else CPU) on port 50051. Extra arguments go to qpool-server.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
build=${QPOOL_BUILD_DIR:-$root/build}
if [ ! -f "$root/models/tiny/pipeline.yaml" ]; then
  PYTHONPATH="$root/tools/qpool_export" "$root/.venv/bin/python" -m qpool_export \
    --preset tiny --out "$root/models/tiny"
fi
echo "try: $build/client/qpool generate --pipeline tiny --prompt 'a red fox in the snow' --out fox.png"
exec "$build/server/qpool-server" --model-repository "$root/models" --load tiny "$@"
