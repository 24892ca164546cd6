"""bench/import_bench.py's time_qpool reports, per component, how many forwards its compiled
package answered and how many TorchScript did (qpool_component_forwards_total), and flags a
compiled component whose package never ran (Note [Compiled forward]): a compiled pipeline timed
at TorchScript's speed must not pass for a compiled one."""

import argparse
import os
import shutil
import sys

import pytest

pytest.importorskip("numpy")
pytest.importorskip("yaml")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import import_bench  # noqa: E402


def _time(server_bin, cli_bin, repo, name, tmp_path):
    a = argparse.Namespace(server_args="--cpu-threads 1", warmup=0, runs=2, steps=2, size=64,
                           guidance=7.5, batch=1, work=str(tmp_path))
    result = import_bench.time_qpool(server_bin, cli_bin, str(repo), name, a,
                                     check_encode=False, device="cpu")
    assert "error" not in result, result
    return result


def test_compiled_forwards_are_counted(server_bin, cli_bin, source_repository, tmp_path):
    result = _time(server_bin, cli_bin, source_repository, "tiny-compiled", tmp_path)
    # Two requests of two steps: four UNet forwards (guidance rides in the batch), all compiled.
    assert result["forwards"]["unet"] == {"compiled": 4, "torchscript": 0}
    assert result["forwards"]["vae_decoder"] == {"compiled": 0, "torchscript": 2}
    assert "compiled_unused" not in result


def test_a_package_that_never_runs_is_flagged(server_bin, cli_bin, source_repository, tmp_path,
                                              capfd):
    """tiny-compiled served in bfloat16: its float32 package binds no tensor, every UNet forward
    runs TorchScript."""
    repo = tmp_path / "repo"
    shutil.copytree(source_repository / "tiny-compiled", repo / "tiny-bf16")
    manifest = repo / "tiny-bf16" / "pipeline.yaml"
    text = manifest.read_text()
    assert "\n  dtype: auto\n" in text
    manifest.write_text(text.replace("\n  dtype: auto\n", "\n  dtype: bfloat16\n"))
    result = _time(server_bin, cli_bin, repo, "tiny-bf16", tmp_path)
    assert result["forwards"]["unet"] == {"compiled": 0, "torchscript": 4}
    assert result["compiled_unused"] == ["unet"]
    assert "tiny-bf16: the compiled forward of unet never ran" in capfd.readouterr().err
