"""The `qpool` CLI binary (QPOOL_CLI_BIN) driven as a user would, against the real server."""

import json
import os
import pathlib
import socket
import subprocess

import pytest

from png_reader import max_abs_diff, read_png

EXIT_OK, EXIT_RPC, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


def run(cli_bin, *args, server=None, timeout=300, cwd=None):
    cmd = [str(cli_bin)]
    if server is not None:
        cmd += ["--server", server]
    cmd += [str(a) for a in args]
    env = dict(os.environ)
    env.pop("QPOOL_SERVER", None)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


@pytest.fixture(scope="module")
def server(make_server):
    client = make_server(pipelines=("tiny", ("tiny", "spare")), load="tiny")
    return client.address


@pytest.fixture
def qpool(cli_bin, server):
    """qpool(*args) runs the CLI against this module's server."""
    return lambda *args, **kw: run(cli_bin, *args, server=server, **kw)


def free_port():
    """A loopback port with nothing listening on it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------- no server needed


def test_help(cli_bin):
    r = run(cli_bin, "--help")
    assert r.returncode == EXIT_OK
    for command in ("generate", "encode", "list", "load", "unload", "offload", "onload", "move",
                    "policy", "empty-cache", "memory", "watch", "snapshot"):
        assert command in r.stdout
    r = run(cli_bin, "generate", "--help")
    assert r.returncode == EXIT_OK
    assert "--pipeline" in r.stdout and "--seed" in r.stdout


@pytest.mark.parametrize("args", [
    [],
    ["frobnicate"],
    ["generate", "--prompt", "no pipeline"],
    ["generate", "--pipeline", "tiny"],
    ["generate", "--pipeline", "tiny", "--prompt", "x", "--steps", "many"],
    ["generate", "--pipeline", "tiny", "--prompt", "x", "--no-such-flag"],
    ["generate", "--pipeline", "tiny", "--prompt"],
    ["load"],
    ["unload", "a", "b"],
    ["encode", "--pipeline", "tiny"],
    ["move", "tiny"],
    ["offload"],
    ["policy", "tiny"],
    ["policy", "tiny", "idle", "--idle-seconds", "soon"],
    ["empty-cache", "extra"],
    ["watch", "--count", "many"],
    ["snapshot"],
    ["--timeout", "soon", "list"],
], ids=lambda a: " ".join(a) or "<none>")
def test_usage_errors_exit_2(cli_bin, args):
    # A server address that would fail: usage errors must be reported before connecting.
    r = run(cli_bin, *args, server=f"127.0.0.1:{free_port()}")
    assert r.returncode == EXIT_USAGE, r.stderr
    assert "usage: qpool" in r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("command", [["list"], ["generate", "--pipeline", "tiny", "--prompt", "x"],
                                     ["health"]])
def test_unreachable_server_exit_3(cli_bin, command):
    address = f"127.0.0.1:{free_port()}"
    r = run(cli_bin, *command, server=address, timeout=60)
    assert r.returncode == EXIT_UNREACHABLE, r.stderr
    assert f"cannot reach qpool-server at {address}" in r.stderr


def test_server_from_environment(cli_bin):
    address = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, QPOOL_SERVER=address)
    r = subprocess.run([str(cli_bin), "list"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == EXIT_UNREACHABLE
    assert address in r.stderr


# ------------------------------------------------------------- against the server


def test_generate_writes_pngs(qpool, tmp_path):
    out = tmp_path / "images"
    r = qpool("generate", "--pipeline", "tiny", "--prompt", "a small house", "--steps", "2",
              "--width", "64", "--height", "32", "--num-images", "2", "--seed", "7",
              "--out", f"{out}/")
    assert r.returncode == EXIT_OK, r.stderr
    files = sorted(out.glob("*.png"))
    assert [f.name for f in files] == ["qpool-7-0.png", "qpool-7-1.png"]
    for f in files:
        png = read_png(f.read_bytes())
        assert (png.width, png.height) == (64, 32)
        assert str(f) in r.stdout
    assert "seed 7" in r.stdout
    assert "device" in r.stdout and "(idle)" in r.stdout


def test_generate_default_out_and_pattern(qpool, tmp_path):
    r = qpool("generate", "--pipeline", "tiny", "--prompt", "x", "--steps", "1", "--seed", "3",
              cwd=tmp_path)
    assert r.returncode == EXIT_OK, r.stderr
    assert (tmp_path / "qpool-3-0.png").exists()
    r = qpool("generate", "--pipeline", "tiny", "--prompt", "x", "--steps", "1", "--seed", "3",
              "--num-images", "2", "--out", str(tmp_path / "cat.png"))
    assert r.returncode == EXIT_OK, r.stderr
    assert (tmp_path / "cat-0.png").exists() and (tmp_path / "cat-1.png").exists()
    # Same seed, same image (a batch of 2 may differ from a batch of 1 by float rounding).
    diff = max_abs_diff(read_png((tmp_path / "cat-0.png").read_bytes()),
                        read_png((tmp_path / "qpool-3-0.png").read_bytes()))
    assert diff <= 3, f"seed 3 in a batch of 2 differs from seed 3 alone by {diff}"
    r = qpool("generate", "--pipeline", "tiny", "--prompt", "x", "--steps", "1", "--seed", "3",
              "--out", str(tmp_path / "again.png"))
    assert r.returncode == EXIT_OK, r.stderr
    assert (tmp_path / "again.png").read_bytes() == (tmp_path / "qpool-3-0.png").read_bytes()


def test_generate_json(qpool, tmp_path):
    r = qpool("--json", "generate", "--pipeline", "tiny", "--prompt", "json please", "--steps",
              "3", "--seed", "21", "--scheduler", "euler", "--guidance", "1.0", "--negative",
              "dark", "--out", str(tmp_path / "j-{seed}-{i}.png"))
    assert r.returncode == EXIT_OK, r.stderr
    doc = json.loads(r.stdout)
    assert doc["seed"] == 21 and doc["steps"] == 3 and doc["scheduler"] == "euler"
    assert doc["progress_events"] == 3
    assert doc["device"]
    assert doc["route"] == "idle" and doc["attempts"] == 1 and doc["batch_size"] == 1
    assert doc["timings"]["total_seconds"] > 0
    (image,) = doc["images"]
    assert image["path"] == str(tmp_path / "j-21-0.png")
    assert read_png(pathlib.Path(image["path"]).read_bytes()).width == image["width"] == 64


def test_generate_unknown_pipeline_exit_1(qpool, tmp_path):
    r = qpool("generate", "--pipeline", "no-such-pipeline", "--prompt", "x", cwd=tmp_path)
    assert r.returncode == EXIT_RPC
    assert "error: NOT_FOUND:" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_generate_invalid_argument_exit_1(qpool, tmp_path):
    r = qpool("generate", "--pipeline", "tiny", "--prompt", "x", "--width", "60", cwd=tmp_path)
    assert r.returncode == EXIT_RPC
    assert "error: INVALID_ARGUMENT:" in r.stderr and "width" in r.stderr


def test_generate_size_conditioning_reaches_the_server(qpool, tmp_path):
    # The tiny pipeline is of kind sd, which takes no size conditioning: the server names the
    # flag's field (an sdxl pipeline takes it: tests/integration/test_import_sdxl.py).
    r = qpool("generate", "--pipeline", "tiny", "--prompt", "x", "--crop-top", "16", cwd=tmp_path)
    assert r.returncode == EXIT_RPC
    assert ("error: INVALID_ARGUMENT: crop_top is size conditioning, which pipeline 'tiny' "
            "(kind sd) does not take") in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_encode(qpool, tmp_path):
    out = tmp_path / "emb.bin"
    r = qpool("--json", "encode", "--pipeline", "tiny", "--out", str(out), "a cat", "a dog")
    assert r.returncode == EXIT_OK, r.stderr
    doc = json.loads(r.stdout)
    emb = doc["embeddings"]
    assert emb["dtype"] == "float32"
    n, length, hidden = emb["shape"]
    assert (n, length) == (2, 77) and hidden > 0
    assert out.stat().st_size == n * length * hidden * 4 == emb["bytes"]
    assert doc["input_ids"]["shape"] == [2, 77]
    r = qpool("encode", "--pipeline", "tiny", "a cat")
    assert r.returncode == EXIT_OK, r.stderr
    assert "float32" in r.stdout and "[1, 77," in r.stdout and "mean" in r.stdout
    r = qpool("--json", "encode", "--pipeline", "tiny", "--dtype", "bfloat16", "--out", str(out),
              "a cat", "a dog")
    assert r.returncode == EXIT_OK, r.stderr
    half = json.loads(r.stdout)["embeddings"]
    assert half["dtype"] == "bfloat16" and half["shape"] == emb["shape"]
    assert out.stat().st_size == n * length * hidden * 2 == half["bytes"]
    r = qpool("encode", "--pipeline", "tiny", "--dtype", "int64", "a cat")
    assert r.returncode == EXIT_USAGE and "--dtype" in r.stderr


def test_list(qpool):
    r = qpool("--json", "list")
    assert r.returncode == EXIT_OK, r.stderr
    pipelines = {p["name"]: p for p in json.loads(r.stdout)["pipelines"]}
    assert pipelines["tiny"]["state"] == "loaded"
    assert pipelines["tiny"]["offload"]["policy"] == "none"
    assert pipelines["spare"]["state"] in ("available", "loaded")
    r = qpool("list")
    assert r.returncode == EXIT_OK
    assert r.stdout.splitlines()[0].split()[:3] == ["NAME", "KIND", "STATE"]
    assert "OFFLOAD" in r.stdout.splitlines()[0]
    assert any(line.split()[:3] == ["tiny", "sd", "loaded"] for line in r.stdout.splitlines())


def test_load_unload_memory(qpool):
    qpool("unload", "spare")  # whatever an earlier test left
    r = qpool("--json", "load", "spare")
    assert r.returncode == EXIT_OK, r.stderr
    doc = json.loads(r.stdout)
    assert doc["already_loaded"] is False and doc["pipeline"]["state"] == "loaded"
    assert doc["stages"]["read_bytes"] > 0 and doc["stages"]["read_seconds"] > 0
    r = qpool("--json", "load", "spare")
    assert json.loads(r.stdout)["already_loaded"] is True
    r = qpool("load", "spare")
    assert r.returncode == EXIT_OK and "already loaded" in r.stdout
    qpool("unload", "spare")
    r = qpool("load", "spare")
    assert r.returncode == EXIT_OK and "of files in" in r.stdout, r.stdout

    r = qpool("--json", "memory")
    assert r.returncode == EXIT_OK, r.stderr
    doc = json.loads(r.stdout)
    assert "cpu" in [d["device"] for d in doc["devices"]]
    loaded = {p["name"]: p for p in doc["pipelines"]}
    assert {"tiny", "spare"} <= set(loaded)
    assert all(c["weight_bytes"] > 0 for c in loaded["spare"]["components"])
    r = qpool("memory")
    assert r.returncode == EXIT_OK
    assert "DEVICE" in r.stdout and "unet" in r.stdout

    r = qpool("--json", "unload", "spare")
    assert r.returncode == EXIT_OK, r.stderr
    doc = json.loads(r.stdout)
    assert doc["name"] == "spare" and doc["freed_bytes"] > 0
    r = qpool("unload", "spare")
    assert r.returncode == EXIT_RPC
    assert "error: FAILED_PRECONDITION:" in r.stderr
    r = qpool("load", "does-not-exist")
    assert r.returncode == EXIT_RPC and "error: NOT_FOUND:" in r.stderr


def test_residency_commands(qpool):
    """offload, onload, move, policy and empty-cache on the CPU: what moved (nothing, here), the
    policy as set, the bytes released; a CPU pipeline cannot be offloaded (exit 1)."""
    r = qpool("offload", "tiny")
    assert r.returncode == EXIT_RPC and "FAILED_PRECONDITION" in r.stderr and "CPU" in r.stderr
    r = qpool("move", "tiny", "--device", "cpu")
    assert r.returncode == EXIT_OK and "nothing had to move" in r.stdout, r.stderr
    r = qpool("--json", "onload", "tiny")
    assert r.returncode == EXIT_OK, r.stderr
    doc = json.loads(r.stdout)
    assert doc["moves"] == [] and doc["bytes"] == 0 and doc["pipeline"]["name"] == "tiny"
    r = qpool("move", "nope", "--device", "cpu")
    assert r.returncode == EXIT_RPC and "NOT_FOUND" in r.stderr
    r = qpool("policy", "tiny", "idle", "--idle-seconds", "30")
    assert r.returncode == EXIT_OK and r.stdout.strip() == "tiny: offload idle 30s", r.stdout
    r = qpool("--json", "policy", "tiny", "none")
    assert r.returncode == EXIT_OK and json.loads(r.stdout)["offload"]["policy"] == "none"
    r = qpool("policy", "tiny", "sometimes")
    assert r.returncode == EXIT_RPC and "INVALID_ARGUMENT" in r.stderr
    r = qpool("--json", "empty-cache")
    assert r.returncode == EXIT_OK, r.stderr
    doc = json.loads(r.stdout)
    assert doc["released_bytes"] >= 0 and "cpu" in [d["device"] for d in doc["devices"]]
    r = qpool("empty-cache")
    assert r.returncode == EXIT_OK and r.stdout.startswith("released "), r.stdout


def test_watch_prints_memory_events(cli_bin, server, qpool):
    """watch --count 2 --json: the load and unload of spare as JSON lines, then exit 0. The
    load/unload pair repeats until the watch (subscribed at some point) has seen two events."""
    watch = subprocess.Popen([str(cli_bin), "--server", server, "--json", "watch", "--count", "2"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(20):
            qpool("load", "spare")
            qpool("unload", "spare")
            try:
                out, err = watch.communicate(timeout=1)
                break
            except subprocess.TimeoutExpired:
                continue
        else:
            pytest.fail("qpool watch --count 2 did not end")
    finally:
        watch.kill()
    assert watch.returncode == EXIT_OK, err
    events = [json.loads(line) for line in out.splitlines()]
    assert len(events) == 2 and {e["pipeline"] for e in events} == {"spare"}
    assert {e["kind"] for e in events} <= {"load", "unload"}
    assert events[1]["sequence"] == events[0]["sequence"] + 1
    assert all(e["outcome"] == "ok" for e in events)


def test_snapshot(qpool, tmp_path):
    """The allocator snapshot covers the machine's GPUs: a pickle where there are some, else
    FAILED_PRECONDITION (exit 1) and no file."""
    import torch

    out = tmp_path / "snapshot.pickle"
    r = qpool("snapshot", "--out", out)
    if torch.cuda.is_available():
        assert r.returncode == EXIT_OK and out.stat().st_size > 0, r.stderr
    else:
        assert r.returncode == EXIT_RPC and "no CUDA" in r.stderr and not out.exists()


def test_health(qpool):
    r = qpool("health")
    assert r.returncode == EXIT_OK, r.stderr
    assert r.stdout.strip() == "SERVING"
    r = qpool("--json", "health", "--service", "qpool.v1.InferenceService")
    assert r.returncode == EXIT_OK, r.stderr
    assert json.loads(r.stdout)["status"] == "SERVING"
