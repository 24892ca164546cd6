"""What the hostile-input catalogues share (test_bad_input_catalogue.py for requests,
test_broken_repository.py for model repositories): status codes, the state a shared server must
be back in after each case, and the fixtures that check it. A module using them defines its own
`client` fixture (the shared server) and imports `baseline` and `server_recovers`."""

import shutil
import time

import grpc
import pytest

from conftest import parse_samples, scrape

INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
OK = grpc.StatusCode.OK

MAX_PROMPT_BYTES = 16 * 1024  # the server's limit on each prompt (kMaxPromptBytes)

# Methods for raw calls (raw_call), and request bytes.
LIST = "/qpool.v1.ModelService/ListPipelines"
UNLOAD = "/qpool.v1.ModelService/UnloadPipeline"
MOVE = "/qpool.v1.ModelService/MovePipeline"
MEMORY = "/qpool.v1.ModelService/GetMemoryReport"
WATCH = "/qpool.v1.ModelService/WatchMemory"
POLICY = "/qpool.v1.ModelService/SetOffloadPolicy"
GENERATE = "/qpool.v1.InferenceService/Generate"
ENCODE = "/qpool.v1.InferenceService/Encode"
STREAMING = {GENERATE, WATCH}
TINY = b"\x0a\x04tiny"  # GenerateRequest / EncodeRequest field 1 (pipeline) = "tiny"
ONE_STEP = b"\x20\x01"  # GenerateRequest field 4 (steps) = 1

def memory_state(client):
    """What must be back after each case: allocated and pipeline bytes per device, the loaded
    pipelines with their bytes and offload policies, leaked and pinned host bytes."""
    report = client.models.GetMemoryReport(client.pb2.GetMemoryReportRequest(), timeout=30)
    policies = {name: info.offload_policy.policy for name, info in client.pipelines().items()
                if info.state == client.pb2.PIPELINE_STATE_LOADED}
    return {
        "devices": {d.device: {"allocated": d.allocated_bytes, "pipelines": d.pipeline_bytes}
                    for d in report.devices},
        "pipelines": {p.name: sum(c.weight_bytes + c.quant_state_bytes + c.other_bytes +
                                  c.graph_bytes for c in p.components)
                      for p in report.pipelines},
        "leaked_bytes_total": report.leaked_bytes_total,
        "pinned_host_bytes": report.pinned_host_bytes,
        "policies": policies,
    }


def busy(client):
    """Queue depths that are not 0 and pipelines with requests in flight."""
    samples = parse_samples(scrape(client))
    depths = {f"{name}{dict(labels)}": value for (name, labels), value in samples.items()
              if name in ("qpool_pipeline_queue_depth", "qpool_device_queue_depth") and value}
    in_flight = {name: info.in_flight for name, info in client.pipelines().items()
                 if info.in_flight}
    return depths, in_flight


def assert_recovered(client, baseline, timeout=30):
    """Nothing in flight (within `timeout` s: a cancelled request ends at its next step, which
    a busy host may delay), a tiny Generate succeeds, and memory is back to `baseline`."""
    start = time.monotonic()
    while any(busy(client)) and time.monotonic() < start + timeout:
        time.sleep(0.02)
    depths, in_flight = busy(client)
    assert not depths and not in_flight, \
        f"still in flight {time.monotonic() - start:.1f} s after the case: {depths} {in_flight}"
    result = client.generate_one(pipeline="tiny", prompt="still serving", steps=1, seed=1,
                                 timeout=60)
    assert len(result.images) == 1 and result.images[0].png.startswith(b"\x89PNG")
    assert memory_state(client) == baseline


@pytest.fixture(scope="module")
def baseline(client):
    client.generate_one(pipeline="tiny", prompt="warm-up", steps=1, seed=1)
    return memory_state(client)


@pytest.fixture(autouse=True)
def server_recovers(request):
    """After each case on the shared server: it serves, nothing is stuck, memory is back."""
    shared = None
    if "client" in request.fixturenames:
        shared = (request.getfixturevalue("client"), request.getfixturevalue("baseline"))
    yield
    if shared is not None:
        assert_recovered(*shared)


def assert_status(error, code, words=()):
    assert error.code() == code, f"{error.code()}: {error.details()}"
    for word in words:
        assert word in (error.details() or ""), (word, error.details())


def unload_quietly(client, name):
    try:
        client.models.UnloadPipeline(client.pb2.UnloadPipelineRequest(name=name), timeout=60)
    except grpc.RpcError as e:
        assert e.code() == PRECONDITION, f"{e.code()}: {e.details()}"  # not loaded


def setup_spare(repository):
    """tiny and spare, a copy of it that cases load and unload."""
    shutil.copytree(repository / "tiny", repository / "spare")


def raw_call(client, method, data, timeout=30):
    """Sends `data` as the request of `method` without serializing; returns the raw replies."""
    if method in STREAMING:
        call = client.channel.unary_stream(method, request_serializer=None,
                                           response_deserializer=None)
        return list(call(data, timeout=timeout))
    call = client.channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    return [call(data, timeout=timeout)]
