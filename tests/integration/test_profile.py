"""--profile-dir (Note [Batch profiler]): the chosen batches, and only they, leave a Chrome trace
and a table of what ran (which bench/kernel_table.py groups), written before the next request
is served; a directory the server cannot write is refused at start."""

import json
import pathlib
import subprocess
import sys
import time

KERNEL_TABLE = pathlib.Path(__file__).resolve().parents[2] / "bench" / "kernel_table.py"


def _rows(tsv):
    lines = tsv.read_text().splitlines()
    assert lines[0].startswith("# cpu: batch "), lines[0]
    assert lines[1] == "name\tcalls\ttotal_us\tmean_us\tshare", lines[1]
    rows = [line.split("\t") for line in lines[2:]]
    assert rows, "no operators in the table"
    return [(name, int(calls), float(total), float(mean), float(share))
            for name, calls, total, mean, share in rows]


def test_the_chosen_batches_leave_a_trace_and_a_table(make_server, tmp_path):
    profile = tmp_path / "profile"
    client = make_server(extra_args=("--profile-dir", str(profile), "--profile-skip", "1",
                                     "--profile-batches", "2"))
    for seed in range(4):  # batch 1 skipped, 2 and 3 recorded, 4 not
        client.generate_one(pipeline="tiny", prompt="a red cube", steps=2, seed=seed)
    deadline = time.monotonic() + 30
    while len(list(profile.glob("*"))) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)  # written by the worker after the reply
    assert sorted(p.name for p in profile.iterdir()) == [
        "tiny-1.kernels.tsv", "tiny-1.trace.json", "tiny-2.kernels.tsv", "tiny-2.trace.json"]
    trace = json.loads((profile / "tiny-1.trace.json").read_text())
    names = {e.get("name", "") for e in trace["traceEvents"]}
    assert "aten::linear" in names and "aten::scaled_dot_product_attention" in names, \
        sorted(names)[:20]
    rows = _rows(profile / "tiny-1.kernels.tsv")
    totals = [total for _, _, total, _, _ in rows]
    assert totals == sorted(totals, reverse=True)
    by_name = {name: (calls, total, mean) for name, calls, total, mean, _ in rows}
    assert all(name.startswith("aten::") for name in by_name)
    calls, total, mean = by_name["aten::linear"]
    assert calls > 0 and abs(total / calls - mean) <= 1e-3 * mean + 1e-3
    # bench/kernel_table.py groups the table: every row in one group, the shares summing to 1.
    out = subprocess.run([sys.executable, str(KERNEL_TABLE), str(profile / "tiny-1.kernels.tsv"),
                          "--json"], capture_output=True, text=True, timeout=60, check=True)
    groups = json.loads(out.stdout)["groups"]
    assert {"matrix product", "attention", "convolution"} <= set(groups), sorted(groups)
    assert abs(sum(g["share"] for g in groups.values()) - 1) < 1e-9
    assert sum(g["calls"] for g in groups.values()) == sum(c for _, c, _, _, _ in rows)
    assert groups["attention"]["top"][0][0].startswith("aten::") and \
        "scaled_dot_product" in groups["attention"]["top"][0][0]


def test_a_profile_dir_the_server_cannot_write_is_refused(server_bin, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    r = subprocess.run([server_bin, "--model-repository", str(tmp_path), "--listen",
                        "127.0.0.1:0", "--profile-dir", str(blocker / "profile")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert f"--profile-dir {blocker / 'profile'}: cannot write there" in r.stderr, r.stderr
    r = subprocess.run([server_bin, "--profile-batches", "0"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--profile-batches" in r.stderr, r.stderr
