"""bench/generate_bench.start_server, which every benchmark script starts its servers with: a
script that dies before stopping its server (an RPC error, say) leaves no server behind to hold a
GPU that the next benchmark then shares with it unknowingly."""

import os
import pathlib
import subprocess
import sys
import textwrap

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"


def test_a_script_that_dies_takes_its_server_with_it(server_bin, source_repository):
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(BENCH)!r})
        from generate_bench import start_server
        proc, address, _ = start_server({str(server_bin)!r}, {str(source_repository)!r}, "cpu", 1)
        print(proc.pid, flush=True)
        raise RuntimeError("the client failed")
    """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "the client failed" in r.stderr, r.stderr[-2000:]
    pid = int(r.stdout.split()[0])
    # The server was the script's child: gone, not a zombie, once the script has exited.
    assert not os.path.exists(f"/proc/{pid}") or \
        "zombie" in pathlib.Path(f"/proc/{pid}/status").read_text().lower()
