"""Request metrics on /metrics: every Generate and Encode is counted once under its pipeline,
RPC and status code, whichever way it ends; names the repository does not hold are counted as
pipeline "unknown"; requests that reached the device worker have a queue time; per-request
memory is exported for GPUs only. With QPOOL_TEST_DEVICE=cuda:N, a request that runs out of GPU
memory is an `oom` memory event."""

import os
import subprocess
import sys
import time

import grpc
import pytest

from conftest import parse_samples, promtool_check, rpc_error, scrape

# (pipeline label, rpc, status) -> how many such requests the `scraped` fixture makes.
EXPECTED_REQUESTS = {
    ("tiny", "generate", "OK"): 1,
    ("tiny", "encode", "OK"): 1,
    ("tiny", "generate", "INVALID_ARGUMENT"): 2,
    ("unknown", "generate", "NOT_FOUND"): 1,
    ("unknown", "encode", "INVALID_ARGUMENT"): 1,
    ("spare", "generate", "FAILED_PRECONDITION"): 1,
}
# (pipeline label, rpc) -> requests that reached the device worker.
EXPECTED_QUEUED = {("tiny", "generate"): 1, ("tiny", "encode"): 1}


def labels(**values):
    return frozenset(values.items())


@pytest.fixture(scope="module")
def scraped(make_server):
    """A fresh server (tiny loaded, spare not), the requests of EXPECTED_REQUESTS, then one
    scrape: (text, samples, the OK Generate's result)."""
    client = make_server(pipelines=("tiny", ("tiny", "spare")), load="tiny")
    pb2 = client.pb2
    result = client.generate_one(pipeline="tiny", prompt="a fox", steps=2, seed=1)
    client.inference.Encode(pb2.EncodeRequest(pipeline="tiny", prompts=["a fox"]), timeout=120)
    for fields, code in (
            (dict(pipeline="tiny", steps=0), grpc.StatusCode.INVALID_ARGUMENT),
            (dict(pipeline="tiny", width=60), grpc.StatusCode.INVALID_ARGUMENT),
            (dict(pipeline="no-such-pipeline"), grpc.StatusCode.NOT_FOUND),
            (dict(pipeline="spare"), grpc.StatusCode.FAILED_PRECONDITION)):
        error = rpc_error(client.generate, prompt="a fox", **fields)
        assert error.code() == code, (fields, error.details())
    error = rpc_error(client.inference.Encode,
                      pb2.EncodeRequest(pipeline="../tiny", prompts=["a fox"]), timeout=30)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    # A call returns to the client once its status is sent; the server records the request
    # right after that, so give the last one a moment to show.
    deadline = time.monotonic() + 10
    while True:
        text = scrape(client)
        samples = parse_samples(text)
        # Count and duration are two updates: wait for both.
        counted = min(sum(series(samples, "qpool_requests_total").values()),
                      sum(series(samples, "qpool_request_duration_seconds_count").values()))
        if counted >= sum(EXPECTED_REQUESTS.values()) or time.monotonic() > deadline:
            return text, samples, result
        time.sleep(0.05)


def series(samples, name):
    """{labels as a dict's items: value} of the samples called `name`."""
    return {key[1]: value for key, value in samples.items() if key[0] == name}


def test_each_request_is_counted_once_by_pipeline_rpc_and_status(scraped):
    _, samples, _ = scraped
    expected = {labels(pipeline=p, rpc=r, status=s): n for (p, r, s), n in EXPECTED_REQUESTS.items()}
    assert series(samples, "qpool_requests_total") == expected


def test_durations_have_one_observation_per_request(scraped):
    _, samples, result = scraped
    expected = {labels(pipeline=p, rpc=r, status=s): n for (p, r, s), n in EXPECTED_REQUESTS.items()}
    assert series(samples, "qpool_request_duration_seconds_count") == expected
    for key, count in expected.items():
        inf = key | {("le", "+Inf")}
        assert samples[("qpool_request_duration_seconds_bucket", inf)] == count
    # The request's wall time includes everything the result's timings report.
    ok = labels(pipeline="tiny", rpc="generate", status="OK")
    assert samples[("qpool_request_duration_seconds_sum", ok)] >= result.timings.total_seconds > 0


def test_queue_time_only_for_requests_that_reached_the_worker(scraped):
    _, samples, _ = scraped
    expected = {labels(pipeline=p, rpc=r): n for (p, r), n in EXPECTED_QUEUED.items()}
    assert series(samples, "qpool_request_queue_seconds_count") == expected


def test_request_memory_is_observed_on_gpus_only(scraped):
    _, samples, result = scraped
    peak = series(samples, "qpool_request_peak_memory_bytes_count")
    working = series(samples, "qpool_request_working_memory_bytes_count")
    if not result.device.startswith("cuda"):
        # The CPU's counters do not see activations, so nothing is exported for it.
        assert peak == working == {}
        return
    ok = {labels(pipeline="tiny", rpc=rpc, device=result.device): 1
          for rpc in ("generate", "encode")}
    assert peak == working == ok
    generate = labels(pipeline="tiny", rpc="generate", device=result.device)
    # The peak includes the resident weights, the working memory only what the request added.
    assert samples[("qpool_request_peak_memory_bytes_sum", generate)] > \
        samples[("qpool_request_working_memory_bytes_sum", generate)] > 0


def test_client_chosen_names_never_become_labels(scraped):
    text, samples, _ = scraped
    assert "no-such-pipeline" not in text and "../tiny" not in text
    # No request ran out of memory: the oom series exist from the start, at 0.
    ooms = {key: value for key, value in series(samples, "qpool_memory_events_total").items()
            if ("kind", "oom") in key}
    assert ooms and not any(ooms.values())
    promtool_check(text)


# Holds all the free memory of a GPU it can, in shrinking chunks, until killed.
FILLER = """
import sys, time, torch
device, held, chunk = sys.argv[1], [], 1 << 30
while chunk >= 1 << 20:
    try:
        held.append(torch.empty(chunk, dtype=torch.uint8, device=device))
    except torch.OutOfMemoryError:
        chunk //= 2
print("held", sum(t.numel() for t in held), flush=True)
time.sleep(3600)
"""


def test_out_of_memory_is_an_oom_event_and_counted(make_server):
    if not os.environ.get("QPOOL_TEST_DEVICE", "cpu").startswith("cuda"):
        pytest.skip("needs the server on a GPU (set QPOOL_TEST_DEVICE to cuda:N)")
    pytest.importorskip("torch")
    client = make_server(pipelines=("tiny",), load="tiny")
    device = client.server.device
    pb2 = client.pb2
    client.generate_one(pipeline="tiny", prompt="warm up", steps=1, seed=1)
    # Without cached blocks, the next request needs new device memory, which the filler holds.
    client.models.EmptyCache(pb2.EmptyCacheRequest(), timeout=30)
    filler = subprocess.Popen([sys.executable, "-c", FILLER, device], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert filler.stdout.readline().startswith("held")
        error = rpc_error(client.generate, pipeline="tiny", prompt="too big", steps=1, seed=2,
                          width=256, height=256, num_images=4)
    finally:
        filler.kill()
        filler.wait(timeout=30)
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
    report = client.models.GetMemoryReport(pb2.GetMemoryReportRequest(max_events=100), timeout=30)
    ooms = [e for e in report.events if e.kind == "oom"]
    assert len(ooms) == 1, [(e.kind, e.message) for e in report.events]
    assert (ooms[0].pipeline, ooms[0].device, ooms[0].outcome) == ("tiny", device, "error")
    assert "out of memory" in ooms[0].message
    assert ooms[0].allocated_before > 0
    # The server goes on serving once the memory is back.
    client.generate_one(pipeline="tiny", prompt="after", steps=1, seed=1)
    samples = parse_samples(scrape(client))
    assert series(samples, "qpool_requests_total") == {
        labels(pipeline="tiny", rpc="generate", status="OK"): 2,
        labels(pipeline="tiny", rpc="generate", status="RESOURCE_EXHAUSTED"): 1}
    assert samples[("qpool_memory_events_total", labels(kind="oom", outcome="error"))] == 1
