"""Fixtures of the integration tier: the real qpool-server binary on a loopback port.

Environment (set by ctest, see tests/integration/CMakeLists.txt):
  QPOOL_SERVER_BIN       path of qpool-server
  QPOOL_CLI_BIN          path of the qpool CLI (test_cli.py only)
  QPOOL_TEST_REPOSITORY  a model repository holding at least `tiny` (built by the exporter)
  QPOOL_TEST_DEVICE      --device for the server (default "cpu", so results do not depend
                         on the host; the GPU tier covers CUDA)

Each test module starts its own server on 127.0.0.1:0 with its own temporary repository
(copies of the exported pipelines, plus whatever broken ones the module adds), and stops it
with SIGTERM, expecting exit code 0.
"""

import os
import pathlib
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
PROTO_DIR = REPO_ROOT / "proto"
LISTEN_RE = re.compile(r"qpool-server listening on (\S+:\d+)")
METRICS_RE = re.compile(r"qpool-server metrics on (\S+:\d+)")
HTTP_RE = re.compile(r"qpool-server http on (\S+:\d+)")
# One sample line of the text exposition: name, {labels} (optional), value.
SAMPLE_RE = re.compile(r'^([a-zA-Z_][a-zA-Z0-9_]*)(?:\{(.*)\})? (\S+)$')
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30

# Values of the exporter's `tiny` preset manifest the tests rely on.
TINY_DEFAULT_STEPS = 4
TINY_DEFAULT_SIZE = 64
TINY_MAX_STEPS = 50
TINY_MAX_SIZE = 256
TINY_MAX_IMAGES = 4


# ------------------------------------------------------------------ generated stubs


@pytest.fixture(scope="session")
def pb(tmp_path_factory):
    """The generated qpool.v1 modules: pb.qpool_pb2 and pb.qpool_pb2_grpc."""
    grpc_tools = pytest.importorskip("grpc_tools", reason="grpcio-tools is not installed")
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("qpool_stubs")
    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    rc = protoc.main([
        "grpc_tools.protoc",
        f"-I{PROTO_DIR}",
        f"-I{include}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        str(PROTO_DIR / "qpool" / "v1" / "qpool.proto"),
    ])
    assert rc == 0, "protoc failed on proto/qpool/v1/qpool.proto"
    sys.path.insert(0, str(out))
    import importlib

    class Stubs:
        qpool_pb2 = importlib.import_module("qpool.v1.qpool_pb2")
        qpool_pb2_grpc = importlib.import_module("qpool.v1.qpool_pb2_grpc")

    return Stubs


# ------------------------------------------------------------------ environment


def _env_path(name):
    value = os.environ.get(name, "")
    if not value:
        pytest.skip(f"{name} is not set (run the integration tests through ctest -L integration)")
    path = pathlib.Path(value)
    if not path.exists():
        pytest.skip(f"{name}={value} does not exist (build it first)")
    return path


@pytest.fixture(scope="session")
def server_bin():
    return _env_path("QPOOL_SERVER_BIN")


@pytest.fixture(scope="session")
def cli_bin():
    return _env_path("QPOOL_CLI_BIN")


@pytest.fixture(scope="session")
def source_repository():
    path = _env_path("QPOOL_TEST_REPOSITORY")
    if not (path / "tiny" / "pipeline.yaml").exists():
        pytest.skip(f"QPOOL_TEST_REPOSITORY={path} has no tiny/pipeline.yaml (build qpool_test_models)")
    return path


@pytest.fixture(scope="session")
def tokenizer_files(tmp_path_factory):
    """(a folder with CLIP's vocab.json and merges.txt, T5's spiece.model), trained here on the
    exporter's prompt corpus, for the tests that build diffusers pipelines themselves."""
    pytest.importorskip("sentencepiece")
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "testing"))
    import tokenizer_sources

    out = tmp_path_factory.mktemp("tokenizers")
    return out, pathlib.Path(tokenizer_sources.write_clip_and_t5(str(out)))


# ------------------------------------------------------------------ repositories


def copy_pipeline(source_repository, repository, name, as_name=None):
    """Copies pipeline `name` of the test repository into `repository` (as `as_name`)."""
    src = pathlib.Path(source_repository) / name
    if not (src / "pipeline.yaml").exists():
        pytest.skip(f"the test repository has no pipeline {name!r}")
    dst = pathlib.Path(repository) / (as_name or name)
    shutil.copytree(src, dst)
    return dst


def copy_placed(folder, repository, name, **placement):
    """Copies pipeline folder `folder` to `repository`/`name` with its manifest's placement
    updated by `placement` (device="cuda:0,cuda:1", say)."""
    import yaml

    copy = pathlib.Path(repository) / name
    shutil.copytree(folder, copy)
    path = copy / "pipeline.yaml"
    manifest = yaml.safe_load(path.read_text())
    manifest.setdefault("placement", {}).update(placement)
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    return copy


def set_limits(pipeline_dir, **limits):
    """Sets the manifest's `limits` entries (max_queue, ...) of a copied pipeline."""
    import yaml

    path = pipeline_dir / "pipeline.yaml"
    manifest = yaml.safe_load(path.read_text())
    manifest.setdefault("limits", {}).update(limits)
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))


def break_manifest(pipeline_dir):
    """Deletes components.unet.file from a copied pipeline's pipeline.yaml (leaving `unet:`
    empty), so its load must fail naming pipeline.yaml and components.unet.file."""
    manifest = pathlib.Path(pipeline_dir) / "pipeline.yaml"
    text = manifest.read_text()
    broken = re.sub(r"(?m)^(\s+)file:\s*unet\.pt\s*\n", "", text)
    assert broken != text, f"no 'file: unet.pt' line in {manifest}"
    manifest.write_text(broken)


# ------------------------------------------------------------------ the server process


_HELP_CACHE = {}


def server_supports(binary, flag):
    """Whether `binary --help` documents `flag` (optional flags such as --metrics-port are
    passed only to servers that have them)."""
    if binary not in _HELP_CACHE:
        try:
            r = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
            _HELP_CACHE[binary] = r.stdout + r.stderr
        except (OSError, subprocess.TimeoutExpired):
            _HELP_CACHE[binary] = ""
    return flag in _HELP_CACHE[binary]


class QpoolServer:
    """One qpool-server process on 127.0.0.1:<free port>."""

    def __init__(self, binary, repository, workdir, load="all", device=None, extra_args=()):
        self.binary = str(binary)
        self.repository = pathlib.Path(repository)
        self.workdir = pathlib.Path(workdir)
        self.load = load
        self.device = device or os.environ.get("QPOOL_TEST_DEVICE", "cpu")
        self.extra_args = list(extra_args)
        self.process = None
        self.address = None
        self.metrics_address = None  # host:port of /metrics
        self.http_address = None  # host:port of the HTTP API (--http-listen)
        self.stdout_lines = []
        self.stderr_path = self.workdir / "qpool-server.stderr"

    def command(self):
        cmd = [self.binary, "--model-repository", str(self.repository),
               "--listen", "127.0.0.1:0", "--log-level", "info", "--device", self.device,
               # ctest runs modules in parallel: one thread per server keeps CPU work from
               # oversubscribing the cores.
               "--cpu-threads", "1"]
        cmd += ["--metrics-listen", "127.0.0.1:0"]
        if self.load:
            cmd += ["--load", self.load]
        return cmd + self.extra_args

    def stderr_text(self):
        try:
            return self.stderr_path.read_text(errors="replace")[-8000:]
        except OSError:
            return ""

    def start(self, timeout=START_TIMEOUT_S):
        self.stderr_file = open(self.stderr_path, "wb")
        self.process = subprocess.Popen(self.command(), stdout=subprocess.PIPE,
                                        stderr=self.stderr_file, cwd=self.workdir)
        lines = queue.Queue()

        def pump():  # keeps reading stdout so the server never blocks on a full pipe
            for raw in self.process.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                self.stdout_lines.append(line)
                lines.put(line)
            lines.put(None)

        self.pump = threading.Thread(target=pump, daemon=True)
        self.pump.start()
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = lines.get(timeout=max(remaining, 0.01)) if remaining > 0 else None
            except queue.Empty:
                line = None
            if line is None:  # stdout closed (the server exited) or the timeout passed
                try:
                    exited = self.process.wait(timeout=5)
                    why = f"qpool-server exited with code {exited} before listening"
                except subprocess.TimeoutExpired:
                    why = (f"qpool-server did not print 'qpool-server listening on HOST:PORT' "
                           f"within {timeout} s")
                self.kill()
                pytest.fail(
                    f"{why}\ncommand: {' '.join(self.command())}\n"
                    f"stdout:\n" + "\n".join(self.stdout_lines[-50:]) +
                    f"\nstderr:\n{self.stderr_text()}")
            metrics = METRICS_RE.search(line)
            if metrics:
                self.metrics_address = metrics.group(1)
            http = HTTP_RE.search(line)
            if http:
                self.http_address = http.group(1)
            match = LISTEN_RE.search(line)
            if match:
                self.address = match.group(1)
                return self

    def wait(self, timeout):
        """Waits for the process to exit and its stdout to be read to the end; returns the exit
        code, or None while it still runs after `timeout` s."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        self.pump.join(timeout=10)
        return code

    def stop(self):
        """SIGTERM, then the exit code (killing the process if it does not exit in time)."""
        if self.process is None:
            return None
        if self.process.poll() is not None:
            self.stderr_file.close()
            return self.process.returncode
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"qpool-server did not exit within {STOP_TIMEOUT_S} s of SIGTERM\n"
                        f"stderr:\n{self.stderr_text()}")
        finally:
            self.stderr_file.close()

    def kill(self):
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class Client:
    """A channel to a running server with the qpool.v1 stubs."""

    def __init__(self, server, pb):
        import grpc

        self.server = server
        self.address = server.address
        self.pb2 = pb.qpool_pb2
        self.channel = grpc.insecure_channel(
            server.address, options=[("grpc.max_receive_message_length", 256 << 20)])
        grpc.channel_ready_future(self.channel).result(timeout=30)
        self.inference = pb.qpool_pb2_grpc.InferenceServiceStub(self.channel)
        self.models = pb.qpool_pb2_grpc.ModelServiceStub(self.channel)

    def generate(self, timeout=300, **fields):
        """Runs Generate; returns (progress events, results) in stream order."""
        request = self.pb2.GenerateRequest(**fields)
        progress, results = [], []
        for response in self.inference.Generate(request, timeout=timeout):
            which = response.WhichOneof("event")
            assert which in ("progress", "result"), f"unexpected event {which!r}"
            assert not results, "a message arrived after the result"
            (progress if which == "progress" else results).append(getattr(response, which))
        return progress, results

    def generate_one(self, **fields):
        """Runs Generate and returns its single GenerateResult."""
        _, results = self.generate(**fields)
        assert len(results) == 1, f"expected exactly one result, got {len(results)}"
        return results[0]

    def allocated(self, device):
        """The caching allocator's allocated bytes on `device`, from GetMemoryReport."""
        report = self.models.GetMemoryReport(self.pb2.GetMemoryReportRequest(max_events=0))
        return next(d.allocated_bytes for d in report.devices if d.device == device)

    def pipelines(self):
        """ListPipelines as {name: PipelineInfo}."""
        response = self.models.ListPipelines(self.pb2.ListPipelinesRequest(), timeout=30)
        return {p.name: p for p in response.pipelines}

    def close(self):
        self.channel.close()


@pytest.fixture(scope="module")
def make_server(server_bin, source_repository, pb, tmp_path_factory):
    """Factory: make_server(pipelines=("tiny",), load="tiny", setup=None, extra_args=(),
    folders=None) -> Client.

    `pipelines` are copied from the test repository (a tuple (name, as_name) copies under
    another name); `folders` ({name: pipeline folder}, e.g. imports) are copied under their
    names; `setup(repository_path)` may add more (e.g. broken ones) before start;
    `extra_args` are more server flags. Servers stop at module teardown with SIGTERM (a test may
    stop its own first: client.server); each must exit with code 0.
    """
    started, clients = [], []

    def factory(pipelines=("tiny",), load="all", setup=None, extra_args=(), folders=None):
        workdir = tmp_path_factory.mktemp("qpool_server")
        repository = workdir / "models"
        repository.mkdir()
        for entry in pipelines:
            name, as_name = (entry, None) if isinstance(entry, str) else entry
            copy_pipeline(source_repository, repository, name, as_name)
        for name, folder in (folders or {}).items():
            shutil.copytree(folder, repository / name)
        if setup is not None:
            setup(repository)
        server = QpoolServer(server_bin, repository, workdir, load=load, extra_args=extra_args)
        started.append(server)
        server.start()
        clients.append(Client(server, pb))
        return clients[-1]

    yield factory
    for client in clients:
        client.close()
    failures = []
    for server in started:
        code = server.stop()
        if server.address is None:
            continue  # never came up; its start already failed the test
        if code != 0:
            failures.append(f"qpool-server exited with {code} after SIGTERM (expected 0)\n"
                            f"stderr:\n{server.stderr_text()}")
    assert not failures, "\n".join(failures)


# ------------------------------------------------------------------ helpers for assertions


def rpc_error(call, *args, **kwargs):
    """Runs `call` (a unary RPC, or a function) expecting grpc.RpcError; returns it."""
    import grpc

    with pytest.raises(grpc.RpcError) as info:
        result = call(*args, **kwargs)
        if hasattr(result, "__iter__") and not isinstance(result, (bytes, str)):
            list(result)
    return info.value


def run_concurrently(count, call):
    """Runs call(i) on `count` threads at once; returns (results, errors) by index."""
    import grpc

    results, errors = {}, {}
    start = threading.Barrier(count)

    def run(i):
        start.wait()
        try:
            results[i] = call(i)
        except grpc.RpcError as e:  # collected, asserted by the caller
            errors[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    return results, errors


def seconds_per_step(client, **fields):
    """Denoising seconds per step of a request like `fields` (a warm 4-step run), to size the
    requests a test needs still running when it acts."""
    client.generate_one(steps=1, **fields)
    result = client.generate_one(steps=4, **fields)
    return result.timings.denoise_seconds / 4


def wait_idle(client, name, timeout=10):
    """Waits until pipeline `name` has no request in flight; returns its in-flight count."""
    deadline = time.monotonic() + timeout
    while client.pipelines()[name].in_flight and time.monotonic() < deadline:
        time.sleep(0.02)
    return client.pipelines()[name].in_flight


def wait_drained(client, timeout=30):
    """Waits until no pipeline has a request in flight and no device queue holds a task (a reply
    goes out before its task has left the device's worker)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = parse_samples(scrape(client))
        depth = sum(v for (name, _), v in samples.items()
                    if name in ("qpool_pipeline_queue_depth", "qpool_device_queue_depth"))
        in_flight = sum(p.in_flight for p in client.pipelines().values())
        if not depth and not in_flight:
            return
        assert time.monotonic() < deadline, f"still busy: depth {depth}, in flight {in_flight}"
        time.sleep(0.05)


def scrape(client):
    """GET /metrics of the client's server; checks the status and Content-Type, returns the
    text."""
    url = f"http://{client.server.metrics_address}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return response.read().decode()


def parse_samples(text):
    """The samples of a text exposition as {(name, frozenset of (label, value)): value}."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE_RE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, labels, value = match.groups()
        key = (name, frozenset(LABEL_RE.findall(labels or "")))
        assert key not in samples, f"repeated sample: {line!r}"
        samples[key] = float(value)
    return samples


def promtool_check(text):
    """Asserts that `promtool check metrics` accepts `text` without a lint complaint."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: run scripts/setup.sh (Debian package prometheus)"
    checked = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                             capture_output=True, timeout=60)
    assert checked.returncode == 0 and not checked.stdout.strip() and \
        not checked.stderr.strip(), checked.stdout.decode() + checked.stderr.decode()
