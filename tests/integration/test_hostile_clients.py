"""Hostile timing and load, each answered with the right status code, after which the shared
server is as it was (catalogue.py's check after every case):

  deadlines      1 ms deadlines, cancellation before and after the first event, a load
                 abandoned on its way, a channel closed mid-stream                 (8 cases)
  concurrency    Generate racing unload/load, 200 ListPipelines at once, 300 WatchMemory streams
                 opened and dropped past --max-watchers, garbage mixed with good requests,
                 100 connections that never handshake                              (5 cases)
"""

import socket
import threading
import time

import grpc
import pytest

from catalogue import (GENERATE, INVALID, MAX_PROMPT_BYTES, OK, PRECONDITION, assert_status,
                       memory_state, raw_call, setup_spare, unload_quietly)
from catalogue import baseline, server_recovers  # noqa: F401 (fixtures)
from conftest import parse_samples, rpc_error, run_concurrently, scrape


@pytest.fixture(scope="module")
def client(make_server):
    return make_server(pipelines=("tiny",), load="tiny", setup=setup_spare)


# ------------------------------------------------------------------ deadlines and cancellation

LONG = dict(pipeline="tiny", prompt="long", steps=50, width=256, height=256, seed=4)


def test_generate_with_a_1_ms_deadline(client):
    error = rpc_error(client.generate, timeout=0.001, **LONG)
    assert_status(error, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_encode_with_a_1_ms_deadline_behind_a_running_generate(client):
    """Alone, a 16-prompt Encode may beat a 1 ms timer on a loaded host; queued behind a running
    Generate it cannot."""
    running = client.inference.Generate(client.pb2.GenerateRequest(**LONG), timeout=60)
    try:
        assert next(running).WhichOneof("event") == "progress"
        error = rpc_error(client.inference.Encode,
                          client.pb2.EncodeRequest(pipeline="tiny", prompts=["x"] * 16),
                          timeout=0.001)
        assert_status(error, grpc.StatusCode.DEADLINE_EXCEEDED)
    finally:
        running.cancel()


def test_generate_cancelled_before_any_message(client):
    stream = client.inference.Generate(client.pb2.GenerateRequest(**LONG), timeout=60)
    stream.cancel()
    assert_status(rpc_error(list, stream), grpc.StatusCode.CANCELLED)


def test_generate_cancelled_after_the_first_progress(client):
    stream = client.inference.Generate(client.pb2.GenerateRequest(**LONG), timeout=60)
    assert next(stream).WhichOneof("event") == "progress"
    stream.cancel()
    assert_status(rpc_error(list, stream), grpc.StatusCode.CANCELLED)


def test_twenty_generates_cancelled_at_once(client):
    streams = [client.inference.Generate(client.pb2.GenerateRequest(**LONG), timeout=120)
               for _ in range(20)]
    deadline = time.monotonic() + 10
    while client.pipelines()["tiny"].in_flight < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert client.pipelines()["tiny"].in_flight == 20
    for stream in streams:
        stream.cancel()
    for stream in streams:
        assert_status(rpc_error(list, stream), grpc.StatusCode.CANCELLED)


def settle_spare(client, timeout=30):
    """Waits until no load of spare is under way (no device task queued and spare's state the
    same for 0.3 s: an abandoned request may reach the server late); returns its state."""
    deadline = time.monotonic() + timeout
    seen, since = None, time.monotonic()
    while time.monotonic() < deadline:
        samples = parse_samples(scrape(client))
        queued = sum(v for (name, _), v in samples.items() if name == "qpool_device_queue_depth")
        state = client.pipelines()["spare"].state
        if queued or state != seen:
            seen, since = state, time.monotonic()
        elif time.monotonic() - since >= 0.3:
            return state
        time.sleep(0.02)
    return seen


def load_then_unload(client, name, timeout=60):
    """Loads `name` (waiting out a load under way), then unloads it: whatever an abandoned load
    left, nothing of `name` stays."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.models.LoadPipeline(client.pb2.LoadPipelineRequest(name=name), timeout=60)
            break
        except grpc.RpcError as e:
            assert e.code() == PRECONDITION and time.monotonic() < deadline, \
                f"{e.code()}: {e.details()}"
            time.sleep(0.05)
    client.models.UnloadPipeline(client.pb2.UnloadPipelineRequest(name=name), timeout=60)


@pytest.mark.parametrize("how", ["cancel-after-20-ms", "deadline-of-1-ms"])
def test_load_abandoned_on_its_way(client, baseline, how):
    """The client gives up on a load: the pipeline ends loaded (the load finished anyway) or not,
    with memory that matches either way, and the unload gives everything back."""
    request = client.pb2.LoadPipelineRequest(name="spare")
    if how == "deadline-of-1-ms":
        error = rpc_error(client.models.LoadPipeline, request, timeout=0.001)
        assert_status(error, grpc.StatusCode.DEADLINE_EXCEEDED)
    else:
        future = client.models.LoadPipeline.future(request, timeout=60)
        time.sleep(0.02)
        if future.cancel():
            assert future.code() == grpc.StatusCode.CANCELLED
    try:
        state = settle_spare(client)
        assert state in (client.pb2.PIPELINE_STATE_LOADED, client.pb2.PIPELINE_STATE_AVAILABLE)
        memory = memory_state(client)
        if state == client.pb2.PIPELINE_STATE_LOADED:
            # Loaded: its bytes are counted once, on its device (the cpu device counts tensors).
            spare = memory["pipelines"].pop("spare")
            del memory["policies"]["spare"]
            device = client.pipelines()["spare"].device
            assert spare > 0 and memory["devices"][device]["pipelines"] >= spare
            memory["devices"][device]["pipelines"] -= spare
            if device == "cpu":
                memory["devices"][device]["allocated"] -= spare
        assert memory == baseline
    finally:
        load_then_unload(client, "spare")


def test_channel_closed_during_generate(client, pb):
    from conftest import Client

    other = Client(client.server, pb)
    stream = other.inference.Generate(client.pb2.GenerateRequest(**LONG), timeout=60)
    assert next(stream).WhichOneof("event") == "progress"
    other.close()
    error = rpc_error(list, stream)
    assert error.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE), \
        f"{error.code()}: {error.details()}"


# ------------------------------------------------------------------ concurrency


def test_generate_racing_unload_and_load(client):
    """50 Generate calls spread over ~1 s while another thread unloads and loads their pipeline:
    each either completes or is refused as not loaded; unloads are refused while any is in
    flight."""
    stop = threading.Event()
    churn, unexpected = [], []

    def churner():
        requests = ((client.models.UnloadPipeline, client.pb2.UnloadPipelineRequest(name="tiny")),
                    (client.models.LoadPipeline, client.pb2.LoadPipelineRequest(name="tiny")))
        while not stop.is_set():
            for call, request in requests:
                while True:  # load always completes, so tiny is loaded when the thread stops
                    try:
                        call(request, timeout=60)
                        churn.append("ok")
                        break
                    except grpc.RpcError as e:
                        if e.code() != PRECONDITION:
                            unexpected.append(f"{e.code()}: {e.details()}")
                            break
                        if call is client.models.UnloadPipeline and stop.is_set():
                            break
                        time.sleep(0.02)
                time.sleep(0.03)

    thread = threading.Thread(target=churner)
    thread.start()
    try:
        def one(i):
            time.sleep(i * 0.02)
            return client.generate_one(pipeline="tiny", prompt=f"race {i}", steps=2, seed=i,
                                       timeout=60)

        results, errors = run_concurrently(50, one)
    finally:
        stop.set()
        thread.join(timeout=120)
    assert not thread.is_alive(), "the unload/load thread hung"
    assert not unexpected, unexpected
    assert len(results) + len(errors) == 50
    for i, error in errors.items():
        assert error.code() == PRECONDITION, f"{i}: {error.code()}: {error.details()}"
        assert "'tiny'" in error.details() and "load" in error.details(), error.details()
    for i, result in results.items():
        assert result.seed == i and result.images[0].png.startswith(b"\x89PNG")
    assert results, "no Generate completed: the race never let one through"
    assert client.pipelines()["tiny"].state == client.pb2.PIPELINE_STATE_LOADED


def test_200_concurrent_list_pipelines(client):
    results, errors = run_concurrently(200, lambda i: client.pipelines())
    assert not errors, {i: f"{e.code()}: {e.details()}" for i, e in list(errors.items())[:5]}
    assert all("tiny" in r and "spare" in r for r in results.values())


def test_connections_that_never_handshake_are_closed(client):
    """An idle TCP connection held its descriptor for gRPC's default handshake timeout of 120 s;
    GrpcServer::kHandshakeTimeoutMs closes it after 10 s, and calls are served meanwhile."""
    host, port = client.server.address.rsplit(":", 1)
    idle = [socket.create_connection((host, int(port)), timeout=5) for _ in range(100)]
    try:
        assert "tiny" in client.pipelines()
        start = time.monotonic()
        for sock in idle:
            sock.settimeout(max(0.1, start + 20 - time.monotonic()))
            while sock.recv(4096):  # the server's HTTP/2 settings, then its close
                pass
        assert time.monotonic() - start < 20
    finally:
        for sock in idle:
            sock.close()


def server_threads(client):
    with open(f"/proc/{client.server.process.pid}/status") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])


def test_watch_memory_streams_opened_and_dropped(client):
    """Three rounds of 100 streams (300 past --max-watchers' 256) opened and dropped: each
    dropped stream gives its place back, and a new one still gets the next events."""
    threads_before = server_threads(client)
    for _ in range(3):
        streams = [client.models.WatchMemory(client.pb2.WatchMemoryRequest(), timeout=60)
                   for _ in range(100)]
        client.pipelines()  # the streams are open once a later call on the channel answers
        assert not [s for s in streams if s.done()], \
            [(s.code(), s.details()) for s in streams if s.done()][:3]
        for stream in streams:
            stream.cancel()
    watch = client.models.WatchMemory(client.pb2.WatchMemoryRequest(), timeout=60)
    client.pipelines()
    client.models.LoadPipeline(client.pb2.LoadPipelineRequest(name="spare"), timeout=60)
    unload_quietly(client, "spare")
    kinds = []
    for event in watch:
        kinds.append((event.kind, event.pipeline))
        if event.kind == "unload":
            break
    watch.cancel()
    assert ("load", "spare") in kinds and kinds[-1] == ("unload", "spare"), kinds
    deadline = time.monotonic() + 10
    while server_threads(client) > threads_before + 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server_threads(client) <= threads_before + 4, (threads_before, server_threads(client))


def test_garbage_mixed_with_good_requests(client):
    """60 callers at once, half of them hostile (invalid names, prompts past the limit,
    unparsable bytes): every good request completes (30 stay within tiny's queue), every bad one
    gets its own error."""
    def call(i):
        kind = i % 4
        if kind == 0:
            return client.generate_one(pipeline="tiny", prompt=f"good {i}", steps=1, seed=i,
                                       timeout=60).seed
        if kind == 1:
            return client.inference.Encode(
                client.pb2.EncodeRequest(pipeline="tiny", prompts=[f"good {i}"]),
                timeout=60).embeddings.shape[0]
        if kind == 2:
            return client.generate(pipeline="..", prompt="x" * (MAX_PROMPT_BYTES + 1), timeout=60)
        return raw_call(client, GENERATE, b"\xff\xff\xff" if i % 8 == 3 else b"\x0a\x7ftiny")

    results, errors = run_concurrently(60, call)
    good = [i for i in range(60) if i % 4 in (0, 1)]
    assert sorted(results) == good, \
        {i: f"{e.code()}: {e.details()}" for i, e in errors.items() if i % 4 in (0, 1)}
    assert all(results[i] == (i if i % 4 == 0 else 1) for i in good)
    assert {errors[i].code() for i in range(2, 60, 4)} == {INVALID}
    # Unparsable bytes: refused without disturbing the others (their code: test_unparsable_*).
    assert all(errors[i].code() != OK for i in range(3, 60, 4))
