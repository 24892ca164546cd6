"""The pool's request scheduling on the CPU: many concurrent clients, the per-pipeline queue
bound, where each request ran and why, and the scheduling metrics. (Replicas on several GPUs,
eviction under a budget and the retry after an out-of-memory error are GPU tests:
tests/integration/test_pool_gpu.py.)"""

import grpc
import pytest

from conftest import (parse_samples, promtool_check, rpc_error, run_concurrently, scrape,
                      set_limits, wait_drained, wait_idle)

CLIENTS = 64


def setup_repository(repository):
    set_limits(repository / "tiny", max_queue=CLIENTS)
    set_limits(repository / "short", max_queue=2)


@pytest.fixture(scope="module")
def client(make_server):
    # tiny: room for every client; short: a copy of tiny that queues at most 2 requests.
    return make_server(pipelines=("tiny", ("tiny", "short")), load="tiny,short",
                       setup=setup_repository)


def test_many_concurrent_clients_get_their_own_results(client):
    results, errors = run_concurrently(
        CLIENTS, lambda i: client.generate_one(pipeline="tiny", prompt=f"client {i}", steps=1,
                                               seed=1000 + i))
    assert not errors, {i: f"{e.code()}: {e.details()}" for i, e in errors.items()}
    assert sorted(results) == list(range(CLIENTS))
    for i, result in results.items():
        assert result.seed == 1000 + i
        assert len(result.images) == 1 and result.images[0].png.startswith(b"\x89PNG")
        assert result.device == "cpu"
        assert result.route in ("idle", "least-loaded"), result.route
        assert result.attempts == 1
    # One replica, 64 requests at once: most found it busy (how many depends on how fast the
    # client threads send; the first one always finds it idle).
    routes = [r.route for r in results.values()]
    assert routes.count("least-loaded") >= 8, routes
    # A request's image depends on its own seed and prompt only.
    again = client.generate_one(pipeline="tiny", prompt="client 5", steps=1, seed=1005)
    assert again.images[0].png == results[5].images[0].png
    assert wait_idle(client, "tiny") == 0


def test_full_pipeline_queue_is_resource_exhausted(client):
    # 2 may wait or run; the other requests at the same instant are refused at once.
    results, errors = run_concurrently(
        8, lambda i: client.generate_one(pipeline="short", prompt="queue", steps=20, seed=i))
    assert errors, "no request was refused by a queue bound of 2"
    for e in errors.values():
        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
        assert "limits.max_queue 2" in e.details(), e.details()
    assert 1 <= len(results) <= 7
    for i, result in results.items():
        assert result.seed == i and len(result.images) == 1
    # The slots come back: nothing is left queued, and the next request runs.
    assert wait_idle(client, "short") == 0
    assert len(client.generate_one(pipeline="short", prompt="after", steps=1).images) == 1


def test_list_shows_replicas_and_queue_bound(client):
    info = client.pipelines()["tiny"]
    assert info.max_queue == CLIENTS
    assert [r.device for r in info.replicas] == ["cpu"]
    replica = info.replicas[0]
    assert replica.residency == "device"
    assert replica.device_bytes == sum(
        c.weight_bytes + c.quant_state_bytes + c.other_bytes + c.graph_bytes
        for c in info.components)
    assert client.pipelines()["short"].max_queue == 2


def test_encode_reports_its_route(client):
    reply = client.inference.Encode(client.pb2.EncodeRequest(pipeline="tiny", prompts=["a"]),
                                    timeout=60)
    assert reply.device == "cpu" and reply.route in ("idle", "least-loaded")


def test_scheduling_metrics(client):
    wait_drained(client)  # the previous test's task may still be leaving the CPU's worker
    text = scrape(client)
    promtool_check(text)
    samples = [(name, dict(labels), value) for (name, labels), value in parse_samples(text).items()]

    def values(name, **labels):
        return [v for n, l, v in samples
                if n == name and all(l.get(k) == x for k, x in labels.items())]

    routed = values("qpool_requests_routed_total", pipeline="tiny", device="cpu")
    # Every request of this module to `tiny` that got past admission was routed once.
    assert sum(routed) >= CLIENTS + 1
    assert set(l["reason"] for n, l, v in samples
               if n == "qpool_requests_routed_total") <= {"idle", "least-loaded", "onload"}
    assert values("qpool_pipeline_queue_depth", pipeline="tiny") == [0]
    assert values("qpool_device_queue_depth", device="cpu") == [0]


def test_bad_devices_flag_is_a_usage_error(server_bin, tmp_path):
    import subprocess

    for flag in ("cuda:x", "cpu,cuda:0", "cuda:0,"):
        r = subprocess.run([server_bin, "--model-repository", str(tmp_path), "--devices", flag,
                            "--listen", "127.0.0.1:0"], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2, (flag, r.returncode, r.stderr)
        assert "invalid device" in r.stderr or "not available" in r.stderr, r.stderr
    r = subprocess.run([server_bin, "--memory-budget", "1.5"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--memory-budget" in r.stderr, r.stderr
    r = subprocess.run([server_bin, "--model-repository", str(tmp_path), "--attention", "fa3",
                        "--listen", "127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "--attention: unknown attention backend 'fa3' (auto, flash, cudnn" in r.stderr, r.stderr
