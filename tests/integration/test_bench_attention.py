"""bench/import_bench.py's time_qpool with --attention (Note [Attention backend]): the tiny
pipeline timed on the CPU by a server started with PyTorch's order and by one with `math`
first, each run's images kept apart and compared, as the GPU runs compare flash and cuDNN."""

import argparse
import os
import sys

import pytest

pytest.importorskip("numpy")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import import_bench  # noqa: E402


def test_each_attention_value_is_timed_with_its_own_images(
        server_bin, cli_bin, source_repository, tmp_path):
    a = argparse.Namespace(server_args="--cpu-threads 1", warmup=0, runs=2, steps=2, size=64,
                           guidance=7.5, batch=1, work=str(tmp_path))
    timed = {}
    for attention in ("auto", "math"):
        key = import_bench.timed_name("tiny", attention)
        timed[key] = import_bench.time_qpool(server_bin, cli_bin, str(source_repository), "tiny", a,
                                             check_encode=False, device="cpu",
                                             attention=attention)
    assert set(timed) == {"tiny", "tiny@math"}
    for key, result in timed.items():
        assert "error" not in result, (key, result)
        assert result["latency"]["n"] == 2, key
        assert sorted(os.listdir(import_bench.png_dir(str(tmp_path), key))) == [
            "qpool-0-0.png", "qpool-1-0.png"], key
    same = import_bench.fidelity(str(tmp_path), "tiny", "tiny@math")
    assert same["images"] == 2
    # Another attention kernel changes the images by rounding at most.
    assert same["identical"] == 2 or same["min_psnr_db"] > 35, same
