"""Graceful drain on SIGTERM (Note [Drain] in server/main.cpp), as a client sees it: health goes
NOT_SERVING and new requests get UNAVAILABLE while the port stays open, requests in flight
finish (or are cancelled at --drain-seconds), every pipeline is unloaded and the process exits 0.
Each test starts its own server and stops it itself."""

import collections
import math
import signal
import subprocess
import threading
import time

import grpc
import pytest

from conftest import rpc_error, seconds_per_step

# The long request: the largest size `tiny` allows and two images, so that a step takes long
# enough to act between steps (about 130 ms on one CPU thread).
LONG = dict(pipeline="tiny", prompt="drain", width=256, height=256, num_images=2, seed=3)
SERVICES = ("", "qpool.v1.InferenceService", "qpool.v1.ModelService")


def long_request(client, seconds):
    """A GenerateRequest that denoises for about `seconds`, or skips when `tiny` is too fast for
    that on this device."""
    per_step = seconds_per_step(client, **LONG)
    steps = math.ceil(seconds / per_step)
    if steps > 50:  # tiny's limits.max_steps
        pytest.skip(f"tiny takes {per_step * 1000:.1f} ms a step here: too fast to drain mid-run")
    return client.pb2.GenerateRequest(steps=steps, **LONG)


def start_running(client, request):
    """Starts `request` and returns its stream once the first progress event arrived (the
    request is running on the worker)."""
    stream = client.inference.Generate(request, timeout=120)
    first = next(stream)
    assert first.WhichOneof("event") == "progress"
    return stream


def health_statuses(client):
    health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
    from grpc_health.v1 import health_pb2_grpc

    stub = health_pb2_grpc.HealthStub(client.channel)
    return {service: stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status
            for service in SERVICES}


def wait_not_serving(client, timeout=5):
    """Health statuses once every service is NOT_SERVING (or the last seen at the timeout)."""
    health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
    deadline = time.monotonic() + timeout
    while True:
        statuses = health_statuses(client)
        done = set(statuses.values()) == {health_pb2.HealthCheckResponse.NOT_SERVING}
        if done or time.monotonic() > deadline:
            return statuses
        time.sleep(0.02)


def log_has(server, text):
    return any(text in line for line in server.stdout_lines)


def test_sigterm_finishes_in_flight_requests_then_unloads_and_exits_0(make_server):
    client = make_server(pipelines=("tiny",), load="tiny")
    server = client.server
    health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
    assert set(health_statuses(client).values()) == {health_pb2.HealthCheckResponse.SERVING}
    request = long_request(client, seconds=3)
    stream = start_running(client, request)
    # A second request waits in the queue behind the running one: it is in flight too.
    queued = {}
    queued_thread = threading.Thread(target=lambda: queued.update(result=client.generate_one(
        pipeline="tiny", prompt="queued", steps=2, seed=4)))
    queued_thread.start()
    deadline = time.monotonic() + 10
    while client.pipelines()["tiny"].in_flight < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.pipelines()["tiny"].in_flight == 2

    server.process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    # The port stays open: probes see NOT_SERVING, new calls a clear UNAVAILABLE.
    statuses = wait_not_serving(client)
    assert set(statuses.values()) == {health_pb2.HealthCheckResponse.NOT_SERVING}, statuses
    refused = rpc_error(client.generate, pipeline="tiny", prompt="too late", steps=1)
    assert refused.code() == grpc.StatusCode.UNAVAILABLE, refused.details()
    assert "draining" in refused.details(), refused.details()
    encode = rpc_error(client.inference.Encode,
                       client.pb2.EncodeRequest(pipeline="tiny", prompts=["too late"]), timeout=10)
    assert encode.code() == grpc.StatusCode.UNAVAILABLE, encode.details()
    # ListPipelines still answers while the requests run.
    assert client.pipelines()["tiny"].in_flight >= 1
    assert stream.is_active(), "the long request ended before the checks: make it longer"

    # Both requests in flight complete with their images.
    rest = list(stream)
    assert rest[-1].WhichOneof("event") == "result", "the in-flight request did not complete"
    assert [image.png[:4] for image in rest[-1].result.images] == [b"\x89PNG"] * 2
    assert len([r for r in rest if r.WhichOneof("event") == "progress"]) == request.steps - 1
    queued_thread.join(timeout=30)
    assert queued["result"].images[0].png.startswith(b"\x89PNG")

    code = server.wait(timeout=25 + 5)
    took = time.monotonic() - signalled
    assert code == 0, server.stderr_text()
    assert took < 25, f"exited {took:.1f} s after SIGTERM, past --drain-seconds' default 25 s"
    assert log_has(server, "drained: no request in flight"), server.stdout_lines[-20:]
    assert log_has(server, "unloaded pipeline 'tiny' from"), server.stdout_lines[-20:]
    assert log_has(server, "unloaded 1 pipeline(s) at exit: tiny"), server.stdout_lines[-20:]


def test_requests_still_running_at_the_drain_deadline_are_cancelled(make_server):
    client = make_server(pipelines=("tiny",), load="tiny", extra_args=("--drain-seconds", "1"))
    server = client.server
    # Runs well past the 1 s the drain gives it.
    stream = start_running(client, long_request(client, seconds=4))

    server.process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    error = rpc_error(list, stream)
    ended = time.monotonic() - signalled
    assert error.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE), \
        f"{error.code()}: {error.details()}"
    assert ended < 3, f"the request ended {ended:.1f} s after SIGTERM with --drain-seconds 1"

    code = server.wait(timeout=10)
    took = time.monotonic() - signalled
    assert code == 0, server.stderr_text()
    assert took < 4, f"exited {took:.1f} s after SIGTERM with --drain-seconds 1"
    assert log_has(server, "drain time is up: cancelling 1 request(s)"), server.stdout_lines[-20:]
    # The cancelled request let go of the pipeline: the unload found nothing in flight.
    assert log_has(server, "unloaded 1 pipeline(s) at exit: tiny"), server.stdout_lines[-20:]


def test_watch_memory_does_not_hold_the_drain(make_server):
    client = make_server(pipelines=("tiny",), load="tiny")
    server = client.server
    watch = client.models.WatchMemory(client.pb2.WatchMemoryRequest(), timeout=60)
    # The stream is open once ListPipelines on the same channel answers after it.
    client.pipelines()
    time.sleep(0.2)

    server.process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    error = rpc_error(list, watch)
    assert error.code() == grpc.StatusCode.UNAVAILABLE, f"{error.code()}: {error.details()}"
    code = server.wait(timeout=30)
    took = time.monotonic() - signalled
    assert code == 0, server.stderr_text()
    assert took < 3, f"an open WatchMemory kept the server {took:.1f} s after SIGTERM"


def test_help_documents_the_drain(server_bin):
    usage = subprocess.run([str(server_bin), "--help"], capture_output=True, text=True, timeout=30)
    assert usage.returncode == 0
    assert "--drain-seconds" in usage.stdout and "default 25" in usage.stdout, usage.stdout
    bad = subprocess.run([str(server_bin), "--drain-seconds", "-1"], capture_output=True,
                         text=True, timeout=30)
    assert bad.returncode == 2 and "--drain-seconds" in bad.stderr, bad.stderr


def server_threads(server):
    with open(f"/proc/{server.process.pid}/status") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])


def test_watch_memory_streams_are_bounded_and_hold_no_thread(make_server):
    """Note [Watchers without threads]: 1000 streams took a server from 14 to 1015 threads, and
    300 starved health and Generate and hung SIGTERM. Now a stream holds no thread, streams past
    --max-watchers get RESOURCE_EXHAUSTED, and the drain ends the open ones at once."""
    health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
    from grpc_health.v1 import health_pb2_grpc

    client = make_server(pipelines=("tiny",), load="tiny", extra_args=("--max-watchers", "300"))
    server = client.server
    before = server_threads(server)
    streams = [client.models.WatchMemory(client.pb2.WatchMemoryRequest(), timeout=120)
               for _ in range(310)]
    client.pipelines()  # the streams are open once a later call on the channel answers
    deadline = time.monotonic() + 30
    while sum(s.done() for s in streams) < 10 and time.monotonic() < deadline:
        time.sleep(0.05)
    refused = [s for s in streams if s.done()]
    assert len(refused) == 10, len(refused)
    assert all(s.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for s in refused), \
        [(s.code(), s.details()) for s in refused[:3]]
    assert server_threads(server) < before + 20, (before, server_threads(server))

    # Health and Generate are served meanwhile, and the open streams get the memory events.
    health = health_pb2_grpc.HealthStub(client.channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == \
        health_pb2.HealthCheckResponse.SERVING
    assert len(client.generate_one(pipeline="tiny", prompt="a fox", steps=1, seed=1).images) == 1
    client.models.EmptyCache(client.pb2.EmptyCacheRequest(), timeout=30)
    client.models.UnloadPipeline(client.pb2.UnloadPipelineRequest(name="tiny"), timeout=60)
    first = next(s for s in streams if not s.done())
    kinds = []
    for event in first:  # on a GPU the empty_cache event comes first
        kinds.append(event.kind)
        if event.kind == "unload":
            break
    assert kinds[-1] == "unload", kinds

    server.process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    code = server.wait(timeout=30)
    took = time.monotonic() - signalled
    assert code == 0, server.stderr_text()
    assert took < 5, f"{took:.1f} s from SIGTERM to exit with 300 WatchMemory streams open"
    # Each open stream, read to its end (its status follows the events it was sent), ended with
    # the drain's UNAVAILABLE.
    codes = collections.Counter(rpc_error(list, s).code() for s in streams
                                if not any(s is r for r in refused))
    assert codes == {grpc.StatusCode.UNAVAILABLE: 300}, codes



def spawn(server_bin, repository, workdir, *flags, listen="127.0.0.1:0", log=True):
    """A qpool-server on `listen` whose output (the log among it) goes to workdir/output, or to a
    pipe closed at once without `log` (as `qpool-server ... | head -c 0`); (process, path)."""
    path = workdir / "output"
    command = [str(server_bin), "--model-repository", str(repository), "--listen", listen,
               "--device", "cpu", "--cpu-threads", "1", *flags]
    if log:
        process = subprocess.Popen(command, stdout=open(path, "wb"), stderr=subprocess.STDOUT,
                                   cwd=workdir)
    else:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   cwd=workdir)
        process.stdout.close()
    return process, path


def wait_for_log(process, path, text, timeout=60):
    deadline = time.monotonic() + timeout
    while text not in path.read_text(errors="replace"):
        assert process.poll() is None, f"exited {process.returncode}: {path.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no '{text}' in {timeout} s: {path.read_text()[-3000:]}"
        time.sleep(0.01)
    return path.read_text(errors="replace")


def repository_of(source_repository, root, names):
    from conftest import copy_pipeline

    repository = root / "models"
    repository.mkdir()
    for name in names:
        copy_pipeline(source_repository, repository, "tiny", name)
    return repository


def test_a_closed_stdout_does_not_stop_the_server(server_bin, source_repository, pb, tmp_path):
    """Note [Signals]: `qpool-server ... | head -c 200` killed the server at start-up (SIGPIPE);
    now a write to the closed pipe fails where it is made and the server serves on."""
    import socket

    with socket.socket() as s:  # a free port: with stdout closed the address is not printed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    repository = repository_of(source_repository, tmp_path, ["tiny"])
    process, _ = spawn(server_bin, repository, tmp_path, "--load", "tiny",
                       listen=f"127.0.0.1:{port}", log=False)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        grpc.channel_ready_future(channel).result(timeout=60)
        models = pb.qpool_pb2_grpc.ModelServiceStub(channel)
        deadline = time.monotonic() + 60
        while models.ListPipelines(pb.qpool_pb2.ListPipelinesRequest(), timeout=30) \
                .pipelines[0].state != pb.qpool_pb2.PIPELINE_STATE_LOADED:
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.05)
    assert process.poll() is None
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0


def test_sighup_and_sigusr1_are_logged_and_ignored(make_server):
    """Note [Signals]: SIGHUP and SIGUSR1 killed the server without a drain."""
    client = make_server(pipelines=("tiny",), load="tiny")
    server = client.server
    for number, name in ((signal.SIGHUP, "SIGHUP"), (signal.SIGUSR1, "SIGUSR1")):
        server.process.send_signal(number)
        deadline = time.monotonic() + 30
        while not log_has(server, f"{name} ignored"):
            assert server.process.poll() is None, server.stderr_text()
            assert time.monotonic() < deadline, f"no '{name} ignored' logged"
            time.sleep(0.02)
    listed = client.models.ListPipelines(client.pb2.ListPipelinesRequest(), timeout=30)
    assert listed.pipelines[0].state == client.pb2.PIPELINE_STATE_LOADED


def test_sigterm_during_start_up_loads_stops_them_and_drains(server_bin, source_repository,
                                                             tmp_path):
    """Note [Signals]: a SIGTERM while --load all runs stops the loads after the one in progress,
    is logged, and the server drains what it loaded and exits 0."""
    repository = repository_of(source_repository, tmp_path, [f"tiny{i}" for i in range(8)])
    process, path = spawn(server_bin, repository, tmp_path, "--load", "all")
    wait_for_log(process, path, "host memory budget")  # logged just before the loads start
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0, path.read_text()[-3000:]
    text = path.read_text(errors="replace")
    assert "start-up loads stopped" in text, text[-3000:]
    assert "SIGTERM: shutting down" in text
