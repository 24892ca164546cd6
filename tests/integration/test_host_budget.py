"""The host memory budget (Note [Host memory budget] in server/pool/pipeline_registry.h): every
replica holds host copies of its components, so a load that would go over --host-memory-budget
first unloads idle pipelines, least recently used first, and fails with RESOURCE_EXHAUSTED when
only busy ones could make room."""

import subprocess
import threading

import grpc
import pytest

from conftest import parse_samples, rpc_error, scrape, wait_idle

# On the CPU (the default test device) one tiny pipeline holds ~7.7 MB of host memory, its
# float32 component files' bytes: room for one, not two. (A GPU replica's host copies are fp16,
# half of that, so these numbers are for the CPU.)
BUDGET = "12MB"


@pytest.fixture(scope="module")
def client(make_server):
    return make_server(pipelines=("tiny", ("tiny", "a"), ("tiny", "b")), load="tiny",
                       extra_args=("--host-memory-budget", BUDGET))


def load(client, name):
    return client.models.LoadPipeline(client.pb2.LoadPipelineRequest(name=name), timeout=120)


def states(client):
    names = client.pb2.PipelineState.Name
    return {name: names(p.state).removeprefix("PIPELINE_STATE_")
            for name, p in client.pipelines().items()}


def test_a_load_unloads_the_least_recently_used_idle_pipeline(client):
    assert states(client) == {"tiny": "LOADED", "a": "AVAILABLE", "b": "AVAILABLE"}
    client.generate_one(pipeline="tiny", prompt="before", steps=1)
    loaded = load(client, "a")
    assert client.pb2.PipelineState.Name(loaded.pipeline.state) == "PIPELINE_STATE_LOADED"
    assert states(client) == {"tiny": "AVAILABLE", "a": "LOADED", "b": "AVAILABLE"}
    # The unload was a real one: its memory event says what it freed, with no leak.
    events = client.models.GetMemoryReport(
        client.pb2.GetMemoryReportRequest(max_events=50), timeout=30).events
    unloads = [e for e in events if e.kind == "unload" and e.pipeline == "tiny"]
    assert unloads and unloads[-1].outcome == "ok"
    assert unloads[-1].attributed_delta_bytes < -7_000_000
    assert len(client.generate_one(pipeline="a", prompt="after", steps=1).images) == 1


def test_a_load_that_only_busy_pipelines_could_make_room_for_fails(client):
    assert states(client)["a"] == "LOADED"
    started = threading.Event()
    outcome = {}

    def busy():
        stream = client.inference.Generate(
            client.pb2.GenerateRequest(pipeline="a", prompt="busy", steps=40, width=128,
                                       height=128), timeout=300)
        for response in stream:
            started.set()
            if response.WhichOneof("event") == "result":
                outcome["images"] = len(response.result.images)

    thread = threading.Thread(target=busy)
    thread.start()
    assert started.wait(60)
    error = rpc_error(load, client, "b")
    thread.join(300)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    assert "bytes of host memory" in error.details() and "--host-memory-budget" in error.details()
    # Nothing was unloaded for the refused load, and the busy request finished.
    assert outcome == {"images": 1}
    assert states(client) == {"tiny": "AVAILABLE", "a": "LOADED", "b": "AVAILABLE"}
    assert wait_idle(client, "a") == 0


def test_host_evictions_metric(client):
    samples = parse_samples(scrape(client))
    evictions = {dict(labels)["pipeline"]: value for (name, labels), value in samples.items()
                 if name == "qpool_host_evictions_total"}
    # Loaded pipelines that were never evicted have their series at 0 (Note [Counters start at
    # zero] in server/pool/pool_metrics.cpp).
    assert evictions.pop("tiny") == 1
    assert evictions.get("a") == 0 and set(evictions.values()) == {0}, evictions


def test_bad_host_memory_budget_is_a_usage_error(server_bin):
    for value in ("0", "1.5", "12XB", "-3GiB", "GiB", "1e400"):
        r = subprocess.run([server_bin, "--host-memory-budget", value], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and "--host-memory-budget" in r.stderr, (value, r.stderr)
