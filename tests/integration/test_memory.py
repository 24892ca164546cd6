"""Memory accounting and residency through the real server: events, WatchMemory, offload
policies (Encode alone included), admin RPCs, and /metrics scraped by promtool and by a real
Prometheus server."""

import json
import shutil
import socket
import subprocess
import time
import urllib.request

import grpc
import pytest

from conftest import promtool_check, rpc_error, scrape


@pytest.fixture(scope="module")
def client(make_server):
    return make_server(pipelines=("tiny", ("tiny", "spare")), load="tiny")


def report(client, max_events=0):
    return client.models.GetMemoryReport(client.pb2.GetMemoryReportRequest(max_events=max_events),
                                         timeout=30)


def test_load_and_unload_are_events_with_consistent_counters(client):
    last = report(client).last_sequence
    loaded = client.models.LoadPipeline(client.pb2.LoadPipelineRequest(name="spare"), timeout=120)
    held = sum(c.weight_bytes + c.quant_state_bytes + c.other_bytes
               for c in loaded.pipeline.components)
    assert held > 0
    unloaded = client.models.UnloadPipeline(client.pb2.UnloadPipelineRequest(name="spare"),
                                            timeout=60)
    assert unloaded.freed_bytes == held
    assert unloaded.leaked_bytes == 0
    events = [e for e in report(client, max_events=100).events if e.sequence > last]
    kinds = [(e.kind, e.pipeline) for e in events]
    assert ("load", "spare") in kinds and ("unload", "spare") in kinds, kinds
    load = next(e for e in events if e.kind == "load")
    unload = next(e for e in events if e.kind == "unload")
    # On the CPU the counters are the host bytes of pipeline tensors: exact.
    assert load.device == unload.device == "cpu"
    assert load.allocated_after - load.allocated_before == load.attributed_delta_bytes == held
    assert unload.allocated_before - unload.allocated_after == held
    assert unload.attributed_delta_bytes == -held
    assert all(e.outcome == "ok" for e in events)


def test_watch_memory_resumes_from_a_sequence(client):
    start = report(client).last_sequence
    client.models.LoadPipeline(client.pb2.LoadPipelineRequest(name="spare"), timeout=120)
    client.models.UnloadPipeline(client.pb2.UnloadPipelineRequest(name="spare"), timeout=60)
    # A watcher that resumes from `start` sees both events, in order, without missing any.
    stream = client.models.WatchMemory(client.pb2.WatchMemoryRequest(after_sequence=start),
                                       timeout=30)
    got = []
    for event in stream:
        got.append(event)
        if len(got) == 2:
            stream.cancel()
            break
    assert [e.sequence for e in got] == [start + 1, start + 2]
    assert [e.kind for e in got] == ["load", "unload"]
    assert got[0].first_available_sequence <= start + 1


def test_model_policy_leaves_nothing_resident_after_encode_alone(client):
    set_policy = client.models.SetOffloadPolicy(
        client.pb2.SetOffloadPolicyRequest(name="tiny",
                                           policy=client.pb2.OffloadPolicy(policy="model")),
        timeout=60)
    assert set_policy.pipeline.offload_policy.policy == "model"
    assert {c.residency for c in set_policy.pipeline.components} == {"host"}
    client.inference.Encode(client.pb2.EncodeRequest(pipeline="tiny", prompts=["a fox"]),
                            timeout=120)
    assert {c.name: c.residency for c in client.pipelines()["tiny"].components} == {
        "text_encoder": "host", "unet": "host", "vae_decoder": "host"}
    # A failed request (bad steps are refused before running) and a full one end the same way.
    client.generate_one(pipeline="tiny", prompt="a fox", steps=2, seed=1)
    assert {c.residency for c in client.pipelines()["tiny"].components} == {"host"}
    back = client.models.SetOffloadPolicy(
        client.pb2.SetOffloadPolicyRequest(name="tiny",
                                           policy=client.pb2.OffloadPolicy(policy="none")),
        timeout=60)
    assert {c.residency for c in back.pipeline.components} == {"device"}


def test_model_policy_gives_the_same_image(client):
    before = client.generate_one(pipeline="tiny", prompt="a fox", steps=2, seed=7)
    for policy in ("model", "none"):
        client.models.SetOffloadPolicy(client.pb2.SetOffloadPolicyRequest(
            name="tiny", policy=client.pb2.OffloadPolicy(policy=policy)), timeout=60)
        again = client.generate_one(pipeline="tiny", prompt="a fox", steps=2, seed=7)
        assert again.images[0].png == before.images[0].png, policy


def test_admin_errors(client):
    pb2 = client.pb2
    error = rpc_error(client.models.OffloadPipeline, pb2.OffloadPipelineRequest(name="tiny"))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "CPU" in error.details()
    error = rpc_error(client.models.OffloadPipeline, pb2.OffloadPipelineRequest(name="spare"))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "not loaded" in error.details()
    error = rpc_error(client.models.OffloadPipeline, pb2.OffloadPipelineRequest(name="nope"))
    assert error.code() == grpc.StatusCode.NOT_FOUND
    error = rpc_error(client.models.MovePipeline, pb2.MovePipelineRequest(name="tiny"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    error = rpc_error(client.models.MovePipeline,
                      pb2.MovePipelineRequest(name="tiny", device="cuda:7"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    for policy, words in (("group", "use 'sequential'"), ("fast", "unknown offload policy")):
        error = rpc_error(client.models.SetOffloadPolicy, pb2.SetOffloadPolicyRequest(
            name="tiny", policy=pb2.OffloadPolicy(policy=policy)))
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and words in error.details()
    # Streaming is planned at load: a pipeline loaded under another policy cannot switch to it.
    error = rpc_error(client.models.SetOffloadPolicy, pb2.SetOffloadPolicyRequest(
        name="tiny", policy=pb2.OffloadPolicy(policy="sequential")))
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "offload.policy: sequential" in error.details()
    error = rpc_error(client.models.SetOffloadPolicy, pb2.SetOffloadPolicyRequest(
        name="tiny", policy=pb2.OffloadPolicy(policy="idle", idle_seconds=-1)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    # The snapshot covers the machine's GPUs, whatever the server's --devices.
    import torch

    if torch.cuda.is_available():
        snapshot = client.models.GetAllocatorSnapshot(pb2.GetAllocatorSnapshotRequest(), timeout=60)
        assert snapshot.pickle
    else:
        error = rpc_error(client.models.GetAllocatorSnapshot, pb2.GetAllocatorSnapshotRequest())
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION and "no CUDA" in error.details()
    # Every device served: the CPU first, then each GPU (--devices auto).
    emptied = client.models.EmptyCache(pb2.EmptyCacheRequest(), timeout=30)
    gpus = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    assert [d.device for d in emptied.after] == ["cpu"] + gpus
    error = rpc_error(client.models.EmptyCache, pb2.EmptyCacheRequest(device="cuda:9"))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_metrics_pass_promtool_and_show_the_pipeline(client):
    # A request first, so that the request families are exported and checked too.
    client.inference.Encode(client.pb2.EncodeRequest(pipeline="tiny", prompts=["a fox"]),
                            timeout=120)
    text = scrape(client)
    assert 'qpool_pipeline_memory_bytes{pipeline="tiny",component="unet",device="cpu",' \
           'kind="weights"}' in text
    assert 'qpool_device_memory_allocated_bytes{device="cpu"}' in text
    assert "qpool_memory_events_total" in text and "qpool_build_info" in text
    assert "qpool_request_duration_seconds_bucket" in text
    # The GPUs' parts and the driver's view are GPU series: absent on the CPU, not zero.
    for name in ("qpool_device_memory_workspace_bytes", "qpool_device_driver_process_bytes",
                 "qpool_device_cuda_context_bytes"):
        assert name not in text
    promtool_check(text)


def test_the_cpu_has_no_gpu_breakdown_and_the_report_serves_without_a_driver(client):
    devices = {d.device: d for d in report(client).devices}
    assert devices["cpu"].allocated_bytes > 0  # tiny's tensors in host memory
    assert not devices["cpu"].HasField("breakdown")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_real_prometheus_scrapes_the_server(client, tmp_path):
    prometheus = shutil.which("prometheus")
    assert prometheus, "prometheus is missing: run scripts/setup.sh (Debian package prometheus)"
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: qpool\n    static_configs: [{{targets: ['{client.server.metrics_address}']}}]\n")
    port = free_port()
    process = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"))
    try:
        query = ('http://127.0.0.1:%d/api/v1/query?query=' % port +
                 urllib.request.quote('sum by (component) (qpool_pipeline_memory_bytes'
                                      '{pipeline="tiny"})'))
        deadline, result = time.monotonic() + 60, []
        while time.monotonic() < deadline and not result:
            time.sleep(1)
            try:
                with urllib.request.urlopen(query, timeout=5) as r:
                    result = json.load(r)["data"]["result"]
            except OSError:
                continue
        assert result, "Prometheus returned no qpool_pipeline_memory_bytes series in 60 s:\n" + \
            (tmp_path / "prometheus.log").read_text()[-3000:]
        by_component = {r["metric"]["component"]: float(r["value"][1]) for r in result}
        listed = {c.name: c.weight_bytes + c.quant_state_bytes + c.other_bytes + c.graph_bytes
                  for c in client.pipelines()["tiny"].components}
        assert by_component == listed
    finally:
        process.terminate()
        process.wait(timeout=30)
