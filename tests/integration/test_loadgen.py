"""The load generator (bench/loadgen.py, behind bench/throughput_bench.py) against a real server
on the CPU: every request counted once, failures counted by status code rather than raised, and a
summary whose numbers hang together."""

import sys

import pytest

from conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "bench"))
import loadgen  # noqa: E402

FAST = dict(steps=2, width=64, height=64)


@pytest.fixture(scope="module")
def client(make_server):
    return make_server(pipelines=("tiny",), load="tiny")


def run(client, pb, pipeline="tiny", **fields):
    workload = loadgen.Workload(pipeline, **{**FAST, **fields})
    return loadgen.run_workload(client.address, workload, (pb.qpool_pb2, pb.qpool_pb2_grpc))


def test_closed_loop_summary(client, pb):
    result = run(client, pb, concurrency=4, requests=8, warmup=2)
    summary = loadgen.summarize(result)

    assert summary["codes"] == {"OK": 8}, [r.error for r in result.records if r.error]
    assert summary["warmup_codes"] == {"OK": 2}
    # Warm-up requests take the first indices; the measured ones follow, each exactly once.
    assert sorted(r.index for r in result.records) == list(range(2, 10))
    assert summary["throughput_rps"] > 0 and summary["throughput_images_per_second"] > 0
    assert (summary["latency_p50_seconds"] <= summary["latency_p90_seconds"] <=
            summary["latency_p99_seconds"] <= summary["latency_max_seconds"])
    assert 0 <= summary["queue_p50_seconds"] <= summary["queue_p99_seconds"]
    assert sum(summary["devices"].values()) == 8 and set(summary["devices"]) == {"cpu"}
    assert all(r.latency_seconds >= r.total_seconds > 0 for r in result.records)
    assert "1gpu" in loadgen.format_table({"1gpu": summary})


def test_failures_are_counted_not_raised(client, pb):
    result = run(client, pb, concurrency=2, requests=3, pipeline="no-such-pipeline")
    summary = loadgen.summarize(result)

    assert summary["codes"] == {"NOT_FOUND": 3}
    assert summary["ok"] == 0 and summary["throughput_rps"] == 0 and summary["devices"] == {}
    assert "latency_p50_seconds" not in summary


def test_open_loop_sends_the_count_asked(client, pb):
    summary = loadgen.summarize(run(client, pb, rate=50.0, requests=4))

    assert summary["codes"] == {"OK": 4}
    assert summary["latency_p50_seconds"] <= summary["latency_max_seconds"]
