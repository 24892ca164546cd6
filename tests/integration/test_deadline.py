"""Request deadlines: a Generate or Encode whose gRPC deadline passes, while it waits in the
queue or between two denoising steps, stops there with DEADLINE_EXCEEDED, is recorded once with
that code, and lets go of its pipeline; the server keeps serving."""

import time

import grpc
import pytest

from conftest import parse_samples, rpc_error, scrape, seconds_per_step, wait_idle

LONG = dict(pipeline="tiny", prompt="deadline", width=256, height=256, seed=5)
MAX_STEPS = 50  # tiny's limits.max_steps


@pytest.fixture(scope="module")
def client(make_server):
    return make_server(pipelines=("tiny",), load="tiny")


@pytest.fixture(scope="module")
def per_step(client):
    """Seconds a denoising step of LONG takes here."""
    return seconds_per_step(client, **LONG)


def requests_counted(client, rpc, status):
    samples = parse_samples(scrape(client))
    return samples.get(("qpool_requests_total", frozenset(
        {("pipeline", "tiny"), ("rpc", rpc), ("status", status)})), 0)


def wait_counted(client, rpc, status, count, timeout=10):
    """qpool_requests_total for tiny/rpc/status once it reaches `count` (the server records a
    call right after its status went out)."""
    deadline = time.monotonic() + timeout
    while requests_counted(client, rpc, status) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return requests_counted(client, rpc, status)


def test_deadline_during_denoising_stops_the_run(client, per_step):
    # The deadline passes about 10 steps into a 50-step run.
    timeout = max(0.5, 10 * per_step)
    if MAX_STEPS * per_step < 3 * timeout:
        pytest.skip(f"tiny takes {per_step * 1000:.1f} ms a step here: too fast for a deadline "
                    "to pass mid-run reliably")
    before = requests_counted(client, "generate", "DEADLINE_EXCEEDED")
    stream = client.inference.Generate(client.pb2.GenerateRequest(steps=MAX_STEPS, **LONG),
                                       timeout=timeout)
    progress = []
    with pytest.raises(grpc.RpcError) as info:
        for message in stream:
            progress.append(message)
    expired = time.monotonic()
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, info.value.details()
    assert 1 <= len(progress) < MAX_STEPS, "the deadline did not pass during denoising"
    # The server stops at the next step instead of running the other ~40.
    assert wait_idle(client, "tiny") == 0
    idle_after = time.monotonic() - expired
    left = (MAX_STEPS - len(progress)) * per_step
    assert idle_after < left / 2, \
        f"the pipeline was busy {idle_after:.2f} s past the deadline ({left:.2f} s of steps left)"
    # Recorded once, with the deadline as the reason (not CANCELLED).
    assert wait_counted(client, "generate", "DEADLINE_EXCEEDED", before + 1) == before + 1
    # The server keeps serving.
    result = client.generate_one(pipeline="tiny", prompt="after the deadline", steps=2, seed=1)
    assert result.images[0].png.startswith(b"\x89PNG")
    assert client.pipelines()["tiny"].in_flight == 0


def test_deadline_passed_in_the_queue(client, per_step):
    # A request runs for about 2 s; two more wait behind it with a 0.3 s deadline.
    steps = min(MAX_STEPS, max(4, round(2.0 / per_step)))
    if steps * per_step < 1.0:
        pytest.skip(f"tiny takes {per_step * 1000:.1f} ms a step here: too fast to hold the queue")
    generate_before = requests_counted(client, "generate", "DEADLINE_EXCEEDED")
    encode_before = requests_counted(client, "encode", "DEADLINE_EXCEEDED")
    running = client.inference.Generate(client.pb2.GenerateRequest(steps=steps, **LONG),
                                        timeout=120)
    assert next(running).WhichOneof("event") == "progress"

    queued = rpc_error(client.generate, timeout=0.3, pipeline="tiny", prompt="queued", steps=1)
    assert queued.code() == grpc.StatusCode.DEADLINE_EXCEEDED, queued.details()
    encode = rpc_error(client.inference.Encode,
                       client.pb2.EncodeRequest(pipeline="tiny", prompts=["queued"]), timeout=0.3)
    assert encode.code() == grpc.StatusCode.DEADLINE_EXCEEDED, encode.details()

    # The running request is not disturbed; the expired ones end when the worker reaches them,
    # without running, and are recorded with DEADLINE_EXCEEDED.
    rest = list(running)
    assert rest[-1].WhichOneof("event") == "result"
    assert wait_idle(client, "tiny") == 0
    assert wait_counted(client, "generate", "DEADLINE_EXCEEDED",
                        generate_before + 1) == generate_before + 1
    assert wait_counted(client, "encode", "DEADLINE_EXCEEDED", encode_before + 1) == encode_before + 1
    reply = client.inference.Encode(client.pb2.EncodeRequest(pipeline="tiny", prompts=["a"]),
                                    timeout=60)
    assert reply.device == "cpu" or reply.device.startswith("cuda:")
