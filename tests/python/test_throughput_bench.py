"""The arithmetic of bench/throughput_bench.py's scaling runs: which one-replica run a run of N
replicas is compared with, its efficiency, and the spreads of requests and memory over devices.
(The bench itself runs against a server; its CPU smoke run is in bench/results/README.md.)

Run: .venv/bin/python -m pytest tests/python/test_throughput_bench.py
"""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import throughput_bench as tb  # noqa: E402


def run(label, pipeline, devices, per_replica, rps, requests=None, peaks=None, codes=None):
    requests = requests or {d: 10 for d in devices}
    summary = {"label": label, "pipeline": pipeline, "replicas": devices,
               "per_replica": per_replica, "throughput_rps": rps, "devices": requests,
               "codes": codes or {"OK": sum(requests.values())},
               "memory": {"series": [{"device": d, "peak_allocated_bytes": b}
                                     for d, b in (peaks or {}).items()]}}
    summary["balance"] = tb.device_balance(summary)
    return summary


def test_runs_of_several_replicas_are_set_against_n_times_the_matching_single_replica_run():
    gpus4 = [f"cuda:{i}" for i in range(4)]
    runs = {r["label"]: r for r in (
        run("1gpu-c2", "sd15", ["cuda:0"], 2, 3.0),
        run("1gpu-c4", "sd15", ["cuda:0"], 4, 3.2),
        run("4gpu-c8", "sd15", gpus4, 2, 11.4),
        run("4gpu-c16", "sd15", gpus4, 4, 12.8),
        run("4gpu@nf4-c8", "sd15-nf4", gpus4, 2, 10.0))}
    scaled = tb.scaling(runs)
    assert set(scaled) == {"4gpu-c8", "4gpu-c16"}  # no one-replica run of sd15-nf4
    assert scaled["4gpu-c8"]["baseline"] == "1gpu-c2"
    assert scaled["4gpu-c8"]["speedup"] == pytest.approx(3.8)
    assert scaled["4gpu-c8"]["efficiency"] == pytest.approx(0.95)
    assert scaled["4gpu-c16"]["baseline"] == "1gpu-c4"
    assert scaled["4gpu-c16"]["efficiency"] == pytest.approx(1.0)


def test_spread_is_the_largest_distance_from_the_mean_over_the_mean():
    assert tb.spread([10, 10, 10, 10]) == 0
    assert tb.spread([9, 11, 10, 10]) == pytest.approx(0.1)
    assert tb.spread([]) is None
    assert tb.spread([0, 0]) is None


def test_balance_counts_a_device_that_served_nothing_and_needs_every_devices_memory():
    gpus = ["cuda:0", "cuda:1"]
    idle = run("2gpu", "sd15", gpus, 2, 1.0, requests={"cuda:0": 20},
               peaks={"cuda:0": 100, "cuda:1": 100})
    assert idle["balance"]["requests"] == {"cuda:0": 20, "cuda:1": 0}
    assert idle["balance"]["requests_spread"] == pytest.approx(1.0)
    assert idle["balance"]["peak_allocated_spread"] == 0
    partial = run("2gpu", "sd15", gpus, 2, 1.0, peaks={"cuda:0": 100})
    assert partial["balance"]["peak_allocated_spread"] is None


def test_verdicts_name_errors_by_code_and_the_targets():
    gpus = ["cuda:0", "cuda:1"]
    runs = {"1gpu-c2": run("1gpu-c2", "sd15", ["cuda:0"], 2, 2.0),
            "2gpu-c4": run("2gpu-c4", "sd15", gpus, 2, 3.0, peaks={"cuda:0": 90, "cuda:1": 110},
                           codes={"OK": 18, "INTERNAL": 2})}
    lines = tb.verdicts(runs, tb.scaling(runs))
    assert lines[0] == "1gpu-c2: errors none"
    assert "1.50x 1gpu-c2 on 2 replicas, efficiency 0.75 (target 0.9)" in lines[1]
    assert "peak allocated per device within 10.0% of the mean" in lines[1]
    assert lines[1].endswith("errors INTERNAL=2")


def test_the_scaling_plot_has_a_line_per_series_and_the_linear_reference():
    import xml.etree.ElementTree as ET

    gpus = lambda n: [f"cuda:{i}" for i in range(n)]  # noqa: E731
    runs = {r["label"]: r for r in (
        run("1gpu-c2", "sd15", gpus(1), 2, 3.0), run("2gpu-c4", "sd15", gpus(2), 2, 6.1),
        run("4gpu-c8", "sd15", gpus(4), 2, 11.4), run("1gpu-c4", "sd15", gpus(1), 4, 3.2),
        run("4gpu-c16", "sd15", gpus(4), 4, 12.8))}
    root = ET.fromstring(tb.scaling_svg(runs, "sd15 <scaling>"))
    ns = "{http://www.w3.org/2000/svg}"
    lines = root.findall(f"{ns}polyline")
    assert len(lines) == 4  # two series, each with its linear reference
    assert len(root.findall(f"{ns}circle")) == 5
    assert [len(p.get("points").split()) for p in lines] == [3, 2, 2, 2]
    texts = [t.text for t in root.iter(f"{ns}text")]
    assert "sd15 <scaling>" in texts and "sd15, 2 in flight per GPU" in texts


def test_no_plot_without_two_pool_sizes():
    assert tb.scaling_svg({"1gpu-c2": run("1gpu-c2", "sd15", ["cuda:0"], 2, 3.0)}, "t") is None


def test_a_run_may_take_its_warm_up_and_window_plus_300_seconds():
    import argparse

    def args(**kw):
        base = dict(run_timeout=None, warmup="16", duration=None)
        base.update(kw)
        return argparse.Namespace(**base)

    assert tb.run_timeout(args(warmup="8s", duration=60)) == 368
    assert tb.run_timeout(args(warmup="16", duration=60)) == 3600  # warm-up in requests
    assert tb.run_timeout(args(warmup="8s")) == 3600  # a number of requests, not seconds
    assert tb.run_timeout(args(warmup="8s", duration=60, run_timeout=90)) == 90
