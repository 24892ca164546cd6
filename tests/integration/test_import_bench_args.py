"""bench/import_bench.py refuses flags that cannot work before it builds or imports anything."""

import pathlib
import subprocess
import sys

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "import_bench.py"


def _run(tmp_path, *args):
    return subprocess.run([sys.executable, str(BENCH), "--server", "x", "--client", "x",
                           "--tokenizer", "x", "--work", str(tmp_path / "work"), "--out",
                           str(tmp_path / "out.json"), *args],
                          capture_output=True, text=True, timeout=120)


def test_an_unknown_peer_is_refused_before_any_work(tmp_path):
    r = _run(tmp_path, "--peers", "eager,max_autotune")
    assert r.returncode == 2, r.stderr
    assert "--peers: unknown peer 'max_autotune'; known: eager, reduce-overhead, max-autotune" \
        in r.stderr, r.stderr
    assert not (tmp_path / "work").exists()


def test_skipping_both_sides_is_refused(tmp_path):
    r = _run(tmp_path, "--skip-qpool", "--skip-diffusers")
    assert r.returncode == 2 and "leaves nothing to time" in r.stderr, r.stderr
