"""--load-on-demand on: a request for a pipeline of the repository that is not loaded loads it
first (once, however many requests wait for it), making room under the host memory budget."""

import grpc
import pytest

from conftest import break_manifest, rpc_error, run_concurrently, wait_idle

# Room for one tiny pipeline (~7.7 MB of float32 host memory on the CPU, the default test
# device), not two.
BUDGET = "12MB"


def setup_repository(repository):
    break_manifest(repository / "broken")


@pytest.fixture(scope="module")
def client(make_server):
    return make_server(pipelines=("tiny", ("tiny", "a"), ("tiny", "broken")), load="",
                       setup=setup_repository,
                       extra_args=("--load-on-demand", "on", "--host-memory-budget", BUDGET))


def loaded(client):
    state = client.pb2.PipelineState.Value("PIPELINE_STATE_LOADED")
    return sorted(name for name, p in client.pipelines().items() if p.state == state)


def load_events(client, name):
    events = client.models.GetMemoryReport(
        client.pb2.GetMemoryReportRequest(max_events=100), timeout=30).events
    return [e for e in events if e.kind == "load" and e.pipeline == name]


def test_a_request_loads_its_pipeline(client):
    assert loaded(client) == []
    result = client.generate_one(pipeline="tiny", prompt="a fox", steps=2, seed=3)
    assert len(result.images) == 1 and result.device == "cpu"
    assert loaded(client) == ["tiny"]
    assert len(load_events(client, "tiny")) == 1


def test_concurrent_requests_wait_for_one_load(client):
    results, errors = run_concurrently(
        8, lambda i: client.generate_one(pipeline="a", prompt=f"boat {i}", steps=1, seed=i))
    assert not errors, {i: e.details() for i, e in errors.items()}
    assert sorted(r.seed for r in results.values()) == list(range(8))
    assert len(load_events(client, "a")) == 1, "one load for every waiting request"
    # The host budget holds one of them: loading `a` unloaded the idle `tiny`.
    assert loaded(client) == ["a"]
    assert wait_idle(client, "a") == 0


def test_encode_loads_too(client):
    response = client.inference.Encode(
        client.pb2.EncodeRequest(pipeline="tiny", prompts=["a fox"]), timeout=120)
    assert list(response.embeddings.shape)[0] == 1
    assert loaded(client) == ["tiny"]


def test_errors_of_the_load_reach_the_request(client):
    missing = rpc_error(client.generate_one, pipeline="nope", prompt="x")
    assert missing.code() == grpc.StatusCode.NOT_FOUND
    broken = rpc_error(client.generate_one, pipeline="broken", prompt="x")
    assert broken.code() == grpc.StatusCode.INVALID_ARGUMENT, broken.details()
    assert "pipeline.yaml" in broken.details()
    assert "broken" not in loaded(client)


def test_bad_load_on_demand_value_is_a_usage_error(server_bin):
    import subprocess

    r = subprocess.run([server_bin, "--load-on-demand", "yes"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--load-on-demand must be on or off" in r.stderr, r.stderr
