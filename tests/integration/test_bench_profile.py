"""bench/import_bench.py --profile: after a pipeline's timed requests, one more is recorded by
the server's profiler (Note [Batch profiler]) and its device time is reported by kind of work.
The recorded request is none of the timed ones, and its images stay out of the timed ones'
folder (which the fidelity comparison reads)."""

import argparse
import os
import sys

import pytest

pytest.importorskip("numpy")
pytest.importorskip("yaml")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import import_bench  # noqa: E402


def _time(server_bin, cli_bin, repo, name, tmp_path, profile):
    a = argparse.Namespace(server_args="--cpu-threads 1", warmup=1, runs=2, steps=2, size=64,
                           guidance=7.5, batch=1, work=str(tmp_path), profile=profile)
    result = import_bench.time_qpool(server_bin, cli_bin, str(repo), name, a,
                                     check_encode=False, device="cpu")
    assert "error" not in result, result
    return result


def test_the_request_after_the_timed_ones_is_profiled(server_bin, cli_bin, source_repository,
                                                      tmp_path):
    result = _time(server_bin, cli_bin, source_repository, "tiny", tmp_path, profile=True)
    kernels = result["kernels"]
    assert "error" not in kernels, kernels
    # The server numbers recorded batches from 1 after those it skipped: one warm-up and two
    # timed requests ran unrecorded, the fourth is the table's.
    folder = tmp_path / "profile" / "tiny"
    assert kernels["table"] == str(folder / "tiny-1.kernels.tsv")
    assert sorted(p.name for p in folder.glob("*.kernels.tsv")) == ["tiny-1.kernels.tsv"]
    assert kernels["header"].startswith("cpu: batch ")
    # On the CPU the table lists ATen operators: the UNet's convolutions are among them.
    assert kernels["total_ms"] > 0
    assert kernels["groups"]["convolution"]["ms"] > 0
    assert abs(sum(g["share"] for g in kernels["groups"].values()) - 1) < 1e-6
    assert all(len(g["top"]) <= 3 for g in kernels["groups"].values())
    assert len(result["requests"]["seconds"]) == 2
    timed = sorted(p.name for p in (tmp_path / "png" / "tiny").iterdir())
    assert timed == ["qpool-0-0.png", "qpool-1-0.png", "qpool-2-0.png"]
    assert [p.name for p in folder.glob("*.png")] == ["3-0.png"]


def test_without_profile_the_server_records_nothing(server_bin, cli_bin, source_repository,
                                                    tmp_path):
    result = _time(server_bin, cli_bin, source_repository, "tiny", tmp_path, profile=False)
    assert "kernels" not in result
    assert not (tmp_path / "profile").exists()
