"""bench/flux_bench.py end to end on the CPU at toy widths (--tiny): the export writes every
variant, the NF4-prequantized one with files of its own, and the serve phase times them through
real servers, compares their images with bf16's and passes --server-args (here a profile). What
the GPU runs of the script do, minus the sizes, so that a lease is not spent on its plumbing."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "flux_bench.py"


def _bench(*args, timeout=600):
    r = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def test_export_and_serve_every_variant_at_toy_widths(tokenizer_files, server_bin, cli_bin,
                                                      tmp_path):
    tokenizer, spiece = tokenizer_files
    work, profile = tmp_path / "work", tmp_path / "profile"
    common = ("--work", str(work), "--device", "cpu", "--size", "64", "--steps", "2",
              "--runs", "1", "--warmup", "1")
    _bench("--phase", "export", *common, "--tiny", "--double", "1", "--single", "1",
           "--t5-layers", "1", "--tokenizer", str(tokenizer), "--spiece", str(spiece),
           "--nf4-prequantized", "--out", str(tmp_path / "export.json"))
    exported = json.loads((tmp_path / "export.json").read_text())
    assert exported["diffusers_bf16"]["latency"]["n"] == 1
    repo = work / "repo"
    assert sorted(os.listdir(repo)) == ["flux-bf16", "flux-nf4", "flux-nf4-prequantized",
                                        "flux-w8a8"]
    # Files of its own, NF4 in the weights files (Note [Weights beside the graph]).
    for name in ("transformer.safetensors", "text_encoder_2.safetensors"):
        mine = repo / "flux-nf4-prequantized" / name
        assert not mine.is_symlink() and mine.stat().st_size < (repo / "flux-bf16" / name).stat(
        ).st_size, name
    assert (repo / "flux-w8a8" / "transformer.pt").is_symlink()

    _bench("--phase", "serve", *common, "--server", server_bin, "--client", cli_bin,
           "--variants", "flux-bf16,flux-w8a8,flux-nf4-prequantized",
           "--server-args", f"--profile-dir {profile} --profile-skip 1 --profile-batches 1",
           "--out", str(tmp_path / "serve.json"))
    served = json.loads((tmp_path / "serve.json").read_text())
    for name in ("flux-bf16", "flux-w8a8", "flux-nf4-prequantized"):
        assert "error" not in served[name], served[name]
        assert served[name]["latency"]["n"] == 1
    quantization = {name: {c: v["quantization"] for c, v in served[name]["components"].items()}
                    for name in ("flux-bf16", "flux-w8a8", "flux-nf4-prequantized")}
    assert quantization["flux-bf16"]["transformer"] == "none"
    assert quantization["flux-w8a8"]["transformer"] == "w8a8"
    assert quantization["flux-nf4-prequantized"]["transformer"] == "nf4"
    assert quantization["flux-nf4-prequantized"]["text_encoder_2"] == "nf4"
    for name in ("flux-w8a8", "flux-nf4-prequantized"):
        assert served[name]["fidelity_vs_flux-bf16"]["images"] > 0
    # Each variant's server profiled its timed request (its second batch).
    assert sorted(p.name for p in profile.glob("*.kernels.tsv")) == [
        "flux-bf16-1.kernels.tsv", "flux-nf4-prequantized-1.kernels.tsv",
        "flux-w8a8-1.kernels.tsv"]
