"""bench/import_bench.py: flags that cannot work are refused before any work, and the whole
script runs on the CPU at toy widths (--tiny --device cpu): SDXL's layout built, imported fp16,
W8A8 and W8A8 with --min-weights (every layer of a toy model below it, so float), served through
real servers, compared with fp16, and the diffusers peer timed (in a process of its own);
--only-min keeps the twins alone; --skip-qpool times the peer alone; a peer past --peer-timeout
is stopped and reported. What its GPU runs do, minus the sizes, so that a lease is not spent on
its plumbing."""

import json
import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "import_bench.py"


def _run(tmp_path, *args, server="x", client="x", tokenizer="x", timeout=120):
    return subprocess.run([sys.executable, str(BENCH), "--server", server, "--client", client,
                           "--tokenizer", tokenizer, "--work", str(tmp_path / "work"), "--out",
                           str(tmp_path / "out.json"), *args],
                          capture_output=True, text=True, timeout=timeout)


def test_an_unknown_peer_is_refused_before_any_work(tmp_path):
    r = _run(tmp_path, "--peers", "eager,max_autotune")
    assert r.returncode == 2, r.stderr
    assert ("--peers: unknown peer 'max_autotune'; known: eager, reduce-overhead, max-autotune, "
            "max-autotune-gemm") in r.stderr, r.stderr
    assert not (tmp_path / "work").exists()


def test_skipping_both_sides_is_refused(tmp_path):
    r = _run(tmp_path, "--skip-qpool", "--skip-diffusers")
    assert r.returncode == 2 and "leaves nothing to time" in r.stderr, r.stderr


def test_only_min_without_min_weights_is_refused(tmp_path):
    r = _run(tmp_path, "--quantize", "w8a8", "--only-min")
    assert r.returncode == 2 and "--only-min needs --min-weights" in r.stderr, r.stderr
    assert not (tmp_path / "work").exists()


def test_sdxl_w8a8_with_min_weights_end_to_end_at_toy_widths(tmp_path, server_bin, cli_bin,
                                                             tokenizer_files):
    clip_tokenizer = tokenizer_files[0]
    common = ("--model", "sdxl", "--tiny", "--device", "cpu", "--size", "32", "--steps", "2",
              "--runs", "1", "--warmup", "1")
    r = _run(tmp_path, *common, "--quantize", "w8a8", "--min-weights", "4194304", "--peers",
             "eager", server=server_bin, client=cli_bin, tokenizer=str(clip_tokenizer),
             timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["complete"] and result["device"] == "cpu"
    assert sorted(result["qpool"]) == ["sdxl", "sdxl-w8a8", "sdxl-w8a8-min"]
    for name, timed in result["qpool"].items():
        assert "error" not in timed, (name, timed)
        assert timed["latency"]["n"] == 1
        # Loaded through the API: the load's stages (Note [Load stages]).
        assert timed["load_stages"]["read_bytes"] > 0, (name, timed["load_stages"])
        assert sum(v for k, v in timed["load_stages"].items() if k.endswith("_seconds")) \
            <= timed["load_seconds"]
    w8a8 = result["qpool"]["sdxl-w8a8"]
    assert {c["quantization"] for c in w8a8["components"].values()} == {"w8a8", "none"}
    assert 30 < w8a8["fidelity_vs_sdxl"]["min_psnr_db"] < 100
    # Every layer of the toy model holds fewer than 4M weights: all stay float, as fp16's.
    assert {c["quantization"] for c in result["qpool"]["sdxl-w8a8-min"]["components"].values()} \
        == {"none"}
    assert result["qpool"]["sdxl-w8a8-min"]["fidelity_vs_sdxl"]["identical"] == 2
    assert result["diffusers_eager"]["latency"]["n"] == 1

    # --only-min: the twins alone, from the imports already in the work folder.
    r = _run(tmp_path, *common, "--quantize", "w8a8", "--min-weights", "4194304", "--only-min",
             "--skip-diffusers", server=server_bin, client=cli_bin,
             tokenizer=str(clip_tokenizer), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert sorted(json.loads((tmp_path / "out.json").read_text())["qpool"]) == \
        ["sdxl", "sdxl-w8a8-min"]

    peers_only = tmp_path / "peers"
    peers_only.mkdir()
    r = _run(peers_only, *common, "--skip-qpool", "--peers", "eager",
             tokenizer=str(clip_tokenizer), timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    alone = json.loads((peers_only / "out.json").read_text())
    assert alone["complete"] and "qpool" not in alone and alone["diffusers_eager"]["latency"]
    assert not (peers_only / "work" / "repo").exists()  # nothing imported


def test_a_peer_past_its_time_limit_is_stopped_and_reported(tmp_path, tokenizer_files):
    r = _run(tmp_path, "--model", "sdxl", "--tiny", "--device", "cpu", "--size", "32", "--steps",
             "2", "--runs", "1", "--warmup", "1", "--skip-qpool", "--peers", "eager",
             "--peer-timeout", "0.5", tokenizer=str(tokenizer_files[0]), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["complete"]
    # Half a second does not even import torch in the peer's process.
    assert result["diffusers_eager"] == {"timed_out_after_seconds": 0.5,
                                         "first_image_seconds": None,
                                         "stopped_while": "compiling and making its first image"}
