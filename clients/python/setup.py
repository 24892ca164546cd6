"""Build hooks of qpool-client: the qpool.v1 stubs are generated from the proto at build time.

build_py runs grpc_tools.protoc on proto/qpool/v1/qpool.proto, from the repository
(../../proto) when building in the tree, else from the copy that sdist puts into the sdist
(./proto). The modules land in qpool_client/_proto/ of the build (of the source tree for an
editable install, where .gitignore keeps them out of git).

Note [Stub file names]: protoc runs with -I at the proto root, so the descriptor's file name is
"qpool/v1/qpool.proto", the same as for anyone else's stubs of this proto; protobuf accepts an
identical file registered twice in one process, not the same messages under two file names.
protoc then writes `from qpool.v1 import qpool_pb2` into the gRPC module, and "qpool.v1.qpool_pb2"
as the messages' module: the import is rewritten to a relative one and the module name to the
real one (pickle finds the messages' classes by it), so the stubs live inside the package and
name nothing outside it.

The runtime requirements are those grpcio-tools declares for itself (grpcio and protobuf at
least as new as the code it generates needs), so a wheel built with any grpcio-tools names
the versions its own stubs need.
"""

import pathlib
import re
import shutil
import tempfile
from importlib import metadata

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = pathlib.Path(__file__).resolve().parent
PROTO = pathlib.PurePosixPath("qpool/v1/qpool.proto")
# The repository's proto folder when building in the tree, else the sdist's copy.
PROTO_ROOTS = (HERE.parent.parent / "proto", HERE / "proto")
STUB_PACKAGE = pathlib.PurePosixPath("qpool_client/_proto")
STUBS = ("qpool_pb2.py", "qpool_pb2.pyi", "qpool_pb2_grpc.py")


def proto_root():
    for root in PROTO_ROOTS:
        if (root / PROTO).is_file():
            return root
    searched = ", ".join(str(root / PROTO) for root in PROTO_ROOTS)
    raise SystemExit(f"qpool-client: {PROTO} not found (looked for {searched})")


def generate_stubs(out_dir):
    """Writes STUBS into `out_dir`, with package-relative imports (Note [Stub file names])."""
    import grpc_tools
    from grpc_tools import protoc

    root = proto_root()
    well_known = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        rc = protoc.main(["grpc_tools.protoc", f"-I{root}", f"-I{well_known}",
                          f"--python_out={tmp}", f"--pyi_out={tmp}", f"--grpc_python_out={tmp}",
                          str(root / PROTO)])
        if rc != 0:
            raise SystemExit(f"qpool-client: grpc_tools.protoc failed on {root / PROTO}")
        package = ".".join(PROTO.parent.parts)  # "qpool.v1"
        for name in STUBS:
            text = (pathlib.Path(tmp) / PROTO.parent / name).read_text()
            text = re.sub(rf"^from {re.escape(package)} import ", "from . import ", text,
                          flags=re.MULTILINE)
            text = re.sub(r"(BuildTopDescriptorsAndMessages\(DESCRIPTOR, )'[\w.]+'",
                          r"\1__name__", text)
            (out_dir / name).write_text(text)


class BuildPyWithStubs(build_py):
    """build_py that also generates the stubs."""

    def run(self):
        super().run()
        generate_stubs(self._stub_dir())

    def _stub_dir(self):
        # An editable install imports the package from the source tree (setuptools asks hooks
        # to write generated files in place then).
        base = HERE if getattr(self, "editable_mode", False) else pathlib.Path(self.build_lib)
        return base / STUB_PACKAGE

    def get_outputs(self, include_bytecode=True):
        stubs = [str(self._stub_dir() / name) for name in STUBS]
        return sorted(set(super().get_outputs(include_bytecode)) | set(stubs))


class SdistWithProto(sdist):
    """sdist that carries a copy of the proto, for builds outside the repository."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        target = pathlib.Path(base_dir) / "proto" / PROTO
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(proto_root() / PROTO, target)


def runtime_requirements():
    """grpcio and protobuf as grpcio-tools (which generates the stubs) requires them, and gRPC's
    health stubs of the same grpcio release."""
    try:
        declared = metadata.requires("grpcio-tools") or ()
    except metadata.PackageNotFoundError:
        raise SystemExit("qpool-client: building needs grpcio-tools (pip installs it unless "
                         "--no-build-isolation is given; then install it first)") from None
    requirements = {}
    for line in declared:
        name = re.match(r"[A-Za-z0-9._-]+", line).group(0).lower()
        if name in ("grpcio", "protobuf") and ";" not in line:
            requirements[name] = line
    missing = {"grpcio", "protobuf"} - set(requirements)
    if missing:
        raise SystemExit(f"qpool-client: grpcio-tools declares no {sorted(missing)} requirement")
    health = re.sub(r"^grpcio\b", "grpcio-health-checking", requirements["grpcio"])
    return [requirements["grpcio"], requirements["protobuf"], health]


setup(cmdclass={"build_py": BuildPyWithStubs, "sdist": SdistWithProto},
      install_requires=runtime_requirements())
