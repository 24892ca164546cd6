"""The pool on two GPUs, through a real server: a pipeline with a replica on each GPU serves
concurrent requests on both, and a request that runs out of memory on one GPU is retried on the
other. Skips without two GPUs."""

import subprocess
import sys
import time

import pytest
import yaml

from conftest import Client, QpoolServer, parse_samples, run_concurrently, scrape
from test_request_metrics import FILLER


def gpu_count():
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count()


pytestmark = pytest.mark.skipif(gpu_count() < 2, reason="needs two GPUs")


def start_server(server_bin, source_repository, pb, workdir, **placement):
    """A server on both GPUs whose `tiny` pipeline has `placement`; returns (server, client)."""
    from conftest import copy_pipeline

    repository = workdir / "models"
    repository.mkdir()
    copy_pipeline(source_repository, repository, "tiny")
    path = repository / "tiny" / "pipeline.yaml"
    manifest = yaml.safe_load(path.read_text())
    manifest.setdefault("placement", {}).update(device="cuda:0,cuda:1", **placement)
    path.write_text(yaml.safe_dump(manifest, sort_keys=False))
    server = QpoolServer(server_bin, repository, workdir, load="tiny", device="cuda")
    server.start()
    return server, Client(server, pb)


@pytest.fixture(scope="module")
def client(server_bin, source_repository, pb, tmp_path_factory):
    server, client = start_server(server_bin, source_repository, pb,
                                  tmp_path_factory.mktemp("qpool_pool_gpu"), replicas="all")
    yield client
    client.close()
    assert server.stop() == 0, server.stderr_text()


def test_one_replica_per_gpu(client):
    info = client.pipelines()["tiny"]
    assert [r.device for r in info.replicas] == ["cuda:0", "cuda:1"]
    assert all(r.residency == "device" and r.device_bytes > 0 for r in info.replicas)


def test_concurrent_requests_spread_over_both_gpus(client):
    by_index, errors = run_concurrently(
        16, lambda i: client.generate_one(pipeline="tiny", prompt=f"spread {i}", steps=20, seed=i))
    assert not errors, [f"{e.code()}: {e.details()}" for e in errors.values()]
    results = list(by_index.values())
    devices = [r.device for r in results]
    assert devices.count("cuda:0") >= 4 and devices.count("cuda:1") >= 4, devices
    # Alone, a request goes to the idle replica with the lowest id (cuda:0), and gives the bytes
    # that cuda:0 gave under load.
    on_gpu0 = next(r for r in results if r.device == "cuda:0")
    alone = client.generate_one(pipeline="tiny", prompt=f"spread {on_gpu0.seed}", steps=20,
                                seed=on_gpu0.seed)
    assert (alone.device, alone.route) == ("cuda:0", "idle")
    assert alone.images[0].png == on_gpu0.images[0].png


def test_out_of_memory_on_one_gpu_is_retried_on_the_other(client):
    pb2 = client.pb2
    client.models.EmptyCache(pb2.EmptyCacheRequest(device="cuda:0"), timeout=30)
    # Both replicas idle and equal: the router picks cuda:0 (lowest id), which the filler holds.
    filler = subprocess.Popen([sys.executable, "-c", FILLER, "cuda:0"], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert filler.stdout.readline().startswith("held")
        result = client.generate_one(pipeline="tiny", prompt="too big for cuda:0", steps=1,
                                     seed=2, width=256, height=256, num_images=4)
    finally:
        filler.kill()
        filler.wait(timeout=30)
    assert (result.device, result.route, result.attempts) == ("cuda:1", "retry-oom", 2)
    assert len(result.images) == 4
    report = client.models.GetMemoryReport(pb2.GetMemoryReportRequest(max_events=100), timeout=30)
    ooms = [e for e in report.events if e.kind == "oom"]
    assert [(e.device, e.pipeline) for e in ooms] == [("cuda:0", "tiny")]
    samples = parse_samples(scrape(client))
    assert samples[("qpool_request_retries_total", frozenset({("pipeline", "tiny")}))] == 1
    # Both replicas keep serving.
    info = client.pipelines()["tiny"]
    assert [r.in_flight for r in info.replicas] == [0, 0]


def test_busy_replicas_scale_out_to_the_other_gpu(server_bin, source_repository, pb,
                                                  tmp_path_factory):
    # One replica on cuda:0 to start with, up to two (placement.max_replicas): while a burst of
    # requests keeps it busy, the router loads a second one on cuda:1 in the background, and the
    # next burst is served by both.
    server, client = start_server(server_bin, source_repository, pb,
                                  tmp_path_factory.mktemp("qpool_scale_out"), replicas=1,
                                  max_replicas=2)
    try:
        assert [r.device for r in client.pipelines()["tiny"].replicas] == ["cuda:0"]
        first, errors = run_concurrently(
            8, lambda i: client.generate_one(pipeline="tiny", prompt=f"burst {i}", steps=30,
                                             seed=i))
        assert not errors, [e.details() for e in errors.values()]
        # The burst was already routed to cuda:0; the new replica arrives meanwhile.
        deadline = time.monotonic() + 60
        while len(client.pipelines()["tiny"].replicas) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [r.device for r in client.pipelines()["tiny"].replicas] == ["cuda:0", "cuda:1"]
        second, errors = run_concurrently(
            8, lambda i: client.generate_one(pipeline="tiny", prompt=f"again {i}", steps=30,
                                             seed=i))
        assert not errors, [e.details() for e in errors.values()]
        devices = [r.device for r in second.values()]
        assert devices.count("cuda:0") >= 2 and devices.count("cuda:1") >= 2, devices
        samples = parse_samples(scrape(client))
        scale_outs = {dict(labels)["device"]: value for (name, labels), value in samples.items()
                      if name == "qpool_replica_scale_outs_total"}
        assert scale_outs == {"cuda:1": 1}, "one scale-out, never beyond max_replicas"
    finally:
        client.close()
        assert server.stop() == 0, server.stderr_text()
