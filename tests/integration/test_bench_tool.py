"""`qpool bench` (the CLI's load test) against real servers on the CPU: closed and open loop, a
request mix with failures by design, every request counted once, errors counted by status code,
requests per device and per server, the memory timeline, the files of --out, usage errors before
any connection, and report.html rendered by headless Chromium."""

import csv
import json
import os
import shutil
import socket
import subprocess

import pytest

EXIT_OK, EXIT_RPC, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3
FAST = ["--steps", "2", "--width", "64", "--height", "64"]
# fast: succeeds; missing: NOT_FOUND; hurried: 8 steps cannot finish within 2 ms.
MIX = """\
- name: fast
  weight: 4
  pipeline: tiny
  prompts: ["a red fox", "a lighthouse, at dusk"]
  steps: 2
  width: 64
  height: 64
- name: missing
  pipeline: no-such-pipeline
- name: hurried
  pipeline: tiny
  steps: 8
  deadline: 0.002
"""
CHROMIUM_TIMEOUT_S = 90


def run(cli_bin, *args, server=None, timeout=120):
    cmd = [str(cli_bin)] + (["--server", server] if server else []) + [str(a) for a in args]
    env = dict(os.environ)
    env.pop("QPOOL_SERVER", None)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def servers(make_server):
    """Two servers with `tiny` loaded: one address, and both as one balanced target."""
    first = make_server(pipelines=("tiny",), load="tiny")
    second = make_server(pipelines=("tiny",), load="tiny")
    return first.address, second.address


@pytest.fixture(scope="module")
def mix_run(cli_bin, servers, tmp_path_factory):
    """One closed-loop run of MIX with a warm-up and --out; (completed process, out dir)."""
    work = tmp_path_factory.mktemp("bench_mix")
    mix = work / "mix.yaml"
    mix.write_text(MIX)
    out = work / "report"
    r = run(cli_bin, "bench", "--mix", mix, "--concurrency", "3", "--requests", "30",
            "--warmup", "3", "--memory-interval", "0.05", "--random-seed", "1", "--label",
            "mix on tiny", "--out", out, server=servers[0])
    return r, out


def test_closed_loop_mix_counts_every_request_once(mix_run, servers):
    r, out = mix_run
    assert r.returncode == EXIT_OK, r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["options"]["loop"] == "closed" and summary["options"]["concurrency"] == 3
    assert summary["requests"] == 30 and sum(summary["codes"].values()) == 30
    assert summary["warmup_requests"] == 3 and sum(summary["warmup_codes"].values()) == 3
    # Each entry's requests end with its code, and all three kinds were drawn.
    templates = summary["templates"]
    assert set(templates) == {"fast", "missing", "hurried"}
    assert summary["codes"] == {"OK": templates["fast"]["requests"],
                                "NOT_FOUND": templates["missing"]["requests"],
                                "DEADLINE_EXCEEDED": templates["hurried"]["requests"]}
    assert "no-such-pipeline" in summary["error_examples"]["NOT_FOUND"]
    assert summary["ok"] == templates["fast"]["ok"] == templates["fast"]["requests"]
    latency = summary["latency_seconds"]
    assert 0 < latency["min"] <= latency["p50"] <= latency["p90"] <= latency["p99"] <= \
        latency["max"]
    assert 0 <= summary["queue_seconds"]["p50"] <= summary["queue_seconds"]["p99"]
    assert summary["first_progress_seconds"]["p50"] <= latency["max"]
    assert summary["throughput_rps"] > 0 and summary["window_seconds"] > 0
    assert summary["devices"] == {"cpu": summary["ok"]}
    host, port = servers[0].rsplit(":", 1)
    assert sum(summary["peers"].values()) + summary["unanswered"] == 30
    assert summary["peers"].get(f"ipv4:{host}:{port}", 0) >= summary["ok"] + \
        summary["codes"]["NOT_FOUND"]
    # The table on stdout.
    assert "mix on tiny" in r.stdout and "P99 MS" in r.stdout
    for entry in ("fast", "missing", "hurried", "NOT_FOUND", "DEADLINE_EXCEEDED"):
        assert entry in r.stdout
    assert f"report: {out / 'report.html'}" in r.stdout


def test_requests_and_memory_csv(mix_run):
    _, out = mix_run
    rows = read_csv(out / "requests.csv")
    # One row per request, warm-up first, each index once.
    assert [int(row["index"]) for row in rows] == list(range(33))
    assert [row["warmup"] for row in rows] == ["1"] * 3 + ["0"] * 30
    for row in rows:
        latency = float(row["latency_s"])
        assert abs(latency - (float(row["end_s"]) - float(row["scheduled_s"]))) < 2e-6
        if row["status"] == "OK":
            assert row["device"] == "cpu" and row["peer"].startswith("ipv4:127.0.0.1:")
            assert latency >= float(row["server_total_s"]) > 0
    assert {row["template"] for row in rows if row["status"] == "NOT_FOUND"} == {"missing"}
    samples = [row for row in read_csv(out / "memory.csv") if row["kind"] == "sample"]
    assert len(samples) >= 3, "the memory timeline is empty"
    assert {row["device"] for row in samples} == {"cpu"}
    assert all(int(row["allocated_bytes"]) > 0 for row in samples)
    times = [float(row["time_s"]) for row in samples]
    assert times == sorted(times)


def test_open_loop_keeps_the_schedule_and_balances(cli_bin, servers, tmp_path):
    """Uniform arrivals every 40 ms over two servers named as one target (round robin)."""
    (a_host, a_port), (b_host, b_port) = (s.rsplit(":", 1) for s in servers)
    target = f"ipv4:{a_host}:{a_port},{b_host}:{b_port}"
    r = run(cli_bin, "bench", "--pipeline", "tiny", *FAST, "--rate", "25", "--arrivals",
            "uniform", "--requests", "12", "--out", tmp_path, server=target)
    assert r.returncode == EXIT_OK, r.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["codes"] == {"OK": 12}
    assert summary["options"]["loop"] == "open" and summary["options"]["rate"] == 25
    assert set(summary["peers"]) == {f"ipv4:{a_host}:{a_port}", f"ipv4:{b_host}:{b_port}"}
    assert sum(summary["peers"].values()) == 12
    rows = read_csv(tmp_path / "requests.csv")
    due = [float(row["scheduled_s"]) for row in rows]
    assert all(abs((b - a) - 0.04) < 1e-6 for a, b in zip(due, due[1:])), due
    assert all(float(row["start_s"]) >= float(row["scheduled_s"]) for row in rows)


def test_open_loop_for_a_duration_with_json(cli_bin, servers):
    r = run(cli_bin, "--json", "bench", "--pipeline", "tiny", *FAST, "--rate", "40",
            "--duration", "0.5", "--memory-interval", "0", server=servers[0])
    assert r.returncode == EXIT_OK, r.stderr
    summary = json.loads(r.stdout)  # --json: the summary document only
    assert summary["requests"] >= 1 and summary["codes"] == {"OK": summary["requests"]}
    assert summary["memory"]["samples"] == 0


def test_failures_only_exit_1_and_are_counted(cli_bin, servers):
    r = run(cli_bin, "--json", "bench", "--pipeline", "no-such-pipeline", "--concurrency", "2",
            "--requests", "3", server=servers[0])
    assert r.returncode == EXIT_RPC, r.stderr
    summary = json.loads(r.stdout)
    assert summary["codes"] == {"NOT_FOUND": 3}
    assert summary["ok"] == 0 and summary["throughput_rps"] == 0 and summary["devices"] == {}
    assert summary["latency_seconds"] is None


def test_unreachable_server_exits_3(cli_bin):
    r = run(cli_bin, "--connect-timeout", "5", "bench", "--pipeline", "tiny",
            server=f"127.0.0.1:{free_port()}")
    assert r.returncode == EXIT_UNREACHABLE
    assert "cannot reach qpool-server" in r.stderr


BAD = [
    ([], "give --pipeline NAME"),
    (["--pipeline", "tiny", "--rate", "0"], "'--rate' wants a number > 0"),
    (["--pipeline", "tiny", "--rate", "-2"], "'--rate' wants a number > 0"),
    (["--pipeline", "tiny", "--rate", "5", "--concurrency", "2"], "give one of them"),
    (["--pipeline", "tiny", "--concurrency", "0"], "'--concurrency' must be at least 1"),
    (["--pipeline", "tiny", "--arrivals", "uniform"], "--arrivals needs --rate"),
    (["--pipeline", "tiny", "--rate", "5", "--arrivals", "bursty"], "poisson or uniform"),
    (["--pipeline", "tiny", "--warmup", "soon"], "'--warmup' wants a number of requests"),
    (["--pipeline", "tiny", "--warmup", "2.5"], "'--warmup' wants a number of requests"),
    (["--pipeline", "tiny", "--requests", "0"], "'--requests' must be at least 1"),
    (["--pipeline", "tiny", "--duration", "soon"], "'--duration' wants a number"),
    (["--pipeline", "tiny", "--deadline", "0"], "'--deadline' wants a number > 0"),
    (["--pipeline", "tiny", "--steps", "-1"], "'--steps' wants a non-negative integer"),
    (["--pipeline", "tiny", "--no-such-flag"], "unknown option '--no-such-flag'"),
    (["--mix", "{mix}", "--pipeline", "tiny"], "not both"),
    (["--mix", "{missing}"], "cannot read mix file"),
    (["--mix", "{bad_mix}"], "mix.yaml:2:3: unknown field 'stpes' in entry 1"),
    (["--pipeline", "tiny", "--out", "{mix}"], "which is not a directory"),
]


@pytest.mark.parametrize("args,message", BAD, ids=lambda a: " ".join(a) if isinstance(a, list)
                         else None)
def test_bad_flags_exit_2_before_connecting(cli_bin, tmp_path, args, message):
    (tmp_path / "good.yaml").write_text(MIX)
    (tmp_path / "mix.yaml").write_text("- pipeline: tiny\n  stpes: 4\n")
    files = {"mix": tmp_path / "good.yaml", "missing": tmp_path / "none.yaml",
             "bad_mix": tmp_path / "mix.yaml"}
    args = [a.format(**files) for a in args]
    # An address where nothing listens: each mistake must be found before connecting.
    r = run(cli_bin, "bench", *args, server=f"127.0.0.1:{free_port()}", timeout=30)
    assert r.returncode == EXIT_USAGE, r.stderr
    assert message in r.stderr
    assert "usage: qpool [global options] bench" in r.stderr
    assert r.stdout == ""


def test_help_lists_the_bench_flags(cli_bin):
    r = run(cli_bin, "bench", "--help")
    assert r.returncode == EXIT_OK
    for flag in ("--concurrency", "--rate", "--arrivals", "--mix", "--warmup", "--duration",
                 "--deadline", "--out", "dns:///"):
        assert flag in r.stdout
    assert "bench" in run(cli_bin, "--help").stdout


def test_report_is_self_contained_and_renders(mix_run, tmp_path):
    _, out = mix_run
    html = (out / "report.html").read_text()
    assert html.count("<svg") == 3
    for external in ("<script", "http:", "https:", "url(", "@import", "<link"):
        assert external not in html, f"report.html references something external: {external}"
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed: cannot render report.html")
    shot = tmp_path / "report.png"
    try:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}",
                        f"--screenshot={shot}", "--window-size=1200,1600",
                        (out / "report.html").as_uri()],
                       capture_output=True, timeout=CHROMIUM_TIMEOUT_S, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.fail(f"chromium did not render report.html within {CHROMIUM_TIMEOUT_S} s")
    assert shot.exists() and shot.stat().st_size > 0, "chromium wrote no screenshot"
    width, height, colors, ink = png_variety(shot.read_bytes())
    assert (width, height) == (1200, 1600)
    # A blank or failed page is one or two colors; charts, text and tables give many.
    assert colors > 100, f"only {colors} distinct colors: the page looks blank"
    assert ink > 0.02, f"only {ink:.1%} of the page differs from its background"


def png_variety(data):
    """(width, height, distinct colors, share of pixels not of the most common color)."""
    try:
        from PIL import Image
        import io
        image = Image.open(io.BytesIO(data)).convert("RGB")
        counts = image.getcolors(maxcolors=1 << 24)
        width, height = image.size
    except ImportError:  # the standard-library reader: slower, same answer
        from png_reader import read_png
        png = read_png(data)
        width, height, c = png.width, png.height, png.channels
        tally = {}
        for row in png.rows:
            for x in range(0, len(row), c):
                key = bytes(row[x:x + 3])
                tally[key] = tally.get(key, 0) + 1
        counts = [(n, key) for key, n in tally.items()]
    most = max(n for n, _ in counts)
    return width, height, len(counts), 1 - most / (width * height)
