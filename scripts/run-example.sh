#!/usr/bin/env bash
# Set-up, build, export the example pipeline "tiny" into models/, and serve it (GPU if there is
# one, else CPU) on 127.0.0.1:50051: this host only, since it runs without TLS or credentials
# (docs/security.md says how to open it up). Extra arguments go to qpool-server (a --listen
# among them wins).
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
exec "$build/server/qpool-server" --model-repository "$root/models" --load tiny \
  --listen 127.0.0.1:50051 "$@"
