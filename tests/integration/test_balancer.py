"""Scale-out behind a real HAProxy (deploy/haproxy/haproxy.cfg, unchanged): two qpool-servers on
`tiny`, each reporting its load through --agent-listen (Note [Agent weight] in
server/api/agent_weight.h), checked with grpc.health.v1, balanced by least connections.

  a. calls through HAProxy are shared by both servers;
  b. a server kept busy by calls HAProxy does not see reports a lower weight and gets fewer of
     the calls sent through HAProxy meanwhile;
  c. a server drained by SIGTERM (--drain-notice-seconds) gets no new call once HAProxy has
     read its "drain", and no call through HAProxy fails.

Each server listens on its own loopback address (127.0.0.2, 127.0.0.3), so that both answer
the agent on the one agent port the configuration names, as pods do. Which server answered is
read from each server's qpool_requests_total (its /metrics) and from HAProxy's own per-server
counters (stot) on its stats socket. The numbers are printed at the end of the module.
"""

import math
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import threading
import time

import grpc
import pytest

from conftest import REPO_ROOT, copy_pipeline, parse_samples, scrape, seconds_per_step

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
CONFIG = REPO_ROOT / "deploy" / "haproxy" / "haproxy.cfg"
ADDRESSES = {"qpool-1": "127.0.0.2", "qpool-2": "127.0.0.3"}
NOTICE_S = 3  # --drain-notice-seconds: over agent-inter (1 s) with room for the check itself
WAIT_S = 15   # bound of every wait on HAProxy
# A call through HAProxy: small and quick on one CPU thread.
SMALL = dict(pipeline="tiny", prompt="balanced", steps=2, seed=1)
# The calls that keep a server busy, sent to it directly on its own pipeline ("busy", a copy of
# tiny) so that they never show in the balanced pipeline's counters.
BUSY = dict(pipeline="busy", prompt="busy", width=256, height=256, num_images=2, seed=2)

REPORT = []


def report(line):
    REPORT.append(line)
    print(line)


def free_port(*hosts):
    """A TCP port free on every one of `hosts` at this instant."""
    for _ in range(50):
        probe = socket.socket()
        probe.bind((hosts[0], 0))
        port = probe.getsockname()[1]
        others = []
        try:
            for host in hosts[1:]:
                other = socket.socket()
                others.append(other)
                other.bind((host, port))
            return port
        except OSError:
            continue
        finally:
            probe.close()
            for other in others:
                other.close()
    pytest.fail(f"no port free on all of {hosts}")


class HAProxy:
    """haproxy -db with deploy/haproxy/haproxy.cfg, its variables pointing at loopback."""

    def __init__(self, workdir, servers, agent_port):
        self.workdir = pathlib.Path(workdir)
        self.stats_path = self.workdir / "stats.sock"
        self.port = free_port("127.0.0.1")
        self.address = f"127.0.0.1:{self.port}"
        self.env = dict(os.environ,
                        QPOOL_HAPROXY_STATS=str(self.stats_path),
                        QPOOL_HAPROXY_BIND=self.address,
                        QPOOL_AGENT_PORT=str(agent_port),
                        QPOOL_SERVER_1=servers["qpool-1"],
                        QPOOL_SERVER_2=servers["qpool-2"])
        self.log_path = self.workdir / "haproxy.log"
        self.process = None

    def start(self):
        checked = subprocess.run([HAPROXY, "-c", "-f", str(CONFIG)], env=self.env,
                                 capture_output=True, text=True, timeout=30)
        assert checked.returncode == 0, checked.stdout + checked.stderr
        self.log = open(self.log_path, "wb")
        self.process = subprocess.Popen([HAPROXY, "-db", "-f", str(CONFIG)], env=self.env,
                                        stdout=self.log, stderr=subprocess.STDOUT,
                                        cwd=self.workdir)
        deadline = time.monotonic() + WAIT_S
        while not self.stats_path.exists():
            assert self.process.poll() is None, self.log_text()
            assert time.monotonic() < deadline, "no stats socket:\n" + self.log_text()
            time.sleep(0.05)

    def log_text(self):
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def command(self, line):
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(self.stats_path))
            s.sendall(line.encode() + b"\n")
            chunks = []
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    return b"".join(chunks).decode()
                chunks.append(chunk)

    def servers(self):
        """`show stat` of backend qpool's servers: {name: {column: value}}."""
        lines = [line for line in self.command("show stat").splitlines() if line.strip()]
        header = lines[0].lstrip("# ").split(",")
        rows = {}
        for line in lines[1:]:
            row = dict(zip(header, line.split(",")))
            if row["pxname"] == "qpool" and row["svname"] in ADDRESSES:
                rows[row["svname"]] = row
        return rows

    def wait_for(self, predicate, what):
        """Polls `show stat` until predicate(servers) holds; returns those servers."""
        deadline = time.monotonic() + WAIT_S
        while True:
            servers = self.servers()
            if predicate(servers):
                return servers
            if time.monotonic() > deadline:
                pytest.fail(f"HAProxy: {what} not seen within {WAIT_S} s: " +
                            str({n: {k: s[k] for k in ("status", "weight", "check_status",
                                                        "agent_status", "agent_desc")}
                                 for n, s in servers.items()}))
            time.sleep(0.05)

    def stop(self):
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process is not None:
            self.log.close()


def ready(servers):
    return len(servers) == 2 and all(
        s["status"] == "UP" and s["weight"] == "100" and s["agent_status"] == "L7OK"
        for s in servers.values())


def agent_answer(address, port):
    """What the server's agent answers now: what HAProxy reads every agent-inter."""
    with socket.create_connection((address, port), timeout=5) as s:
        return s.makefile("rb").readline().decode().strip()


@pytest.fixture(scope="module")
def farm(request, make_server, source_repository, pb, tmp_path_factory):
    if not os.path.exists(HAPROXY):
        pytest.skip("haproxy is not installed (Debian package haproxy)")
    agent_port = free_port(*ADDRESSES.values())

    def busy_copy(repository):
        copy_pipeline(source_repository, repository, "tiny", "busy")

    clients = {}
    for name, host in ADDRESSES.items():
        clients[name] = make_server(
            pipelines=("tiny",), load="all", setup=busy_copy,
            extra_args=("--listen", f"{host}:0", "--agent-listen", f"{host}:{agent_port}",
                        "--drain-notice-seconds", str(NOTICE_S), "--drain-seconds", "20"))
    haproxy = HAProxy(tmp_path_factory.mktemp("haproxy"),
                      {name: c.server.address for name, c in clients.items()}, agent_port)
    channel = grpc.insecure_channel(haproxy.address)
    try:
        haproxy.start()
        grpc.channel_ready_future(channel).result(timeout=WAIT_S)
        haproxy.wait_for(ready, "both servers UP with their agents' full weight")
        yield Farm(clients, haproxy, pb.qpool_pb2_grpc.InferenceServiceStub(channel),
                   pb.qpool_pb2, agent_port)
    finally:
        channel.close()
        haproxy.stop()
        # The numbers, on the terminal even when every test passed (-q, output captured).
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        if reporter is not None and capture is not None and REPORT:
            with capture.global_and_fixture_disabled():
                reporter.write_line("")
                reporter.write_sep("-", "test_balancer numbers")
                for line in REPORT:
                    reporter.write_line(line)


class Farm:
    def __init__(self, clients, haproxy, stub, pb2, agent_port):
        self.clients = clients
        self.agent_port = agent_port
        self.haproxy = haproxy
        self.stub = stub
        self.pb2 = pb2

    def generate(self, **fields):
        """One Generate through HAProxy, to its result."""
        responses = list(self.stub.Generate(self.pb2.GenerateRequest(**fields), timeout=60))
        assert responses[-1].WhichOneof("event") == "result"

    def answered(self):
        """{server: Generate calls of pipeline tiny that ended there, any status}."""
        counts = {}
        for name, client in self.clients.items():
            samples = parse_samples(scrape(client))
            counts[name] = int(sum(
                value for (metric, labels), value in samples.items()
                if metric == "qpool_requests_total"
                and ("pipeline", "tiny") in labels and ("rpc", "generate") in labels))
        return counts

    def run_through(self, threads, seconds=None, calls=None):
        """Starts `threads` threads sending SMALL calls through HAProxy, `calls` in all or for
        `seconds`; returns the threads and the list they fill with (start, end, error or
        None)."""
        done, lock = [], threading.Lock()
        counter = iter(range(10**9))
        stop = time.monotonic() + seconds if seconds else None

        def loop():
            while True:
                with lock:
                    i = next(counter)
                if (calls is not None and i >= calls) or (stop and time.monotonic() > stop):
                    return
                start = time.monotonic()
                try:
                    self.generate(**SMALL)
                    error = None
                except grpc.RpcError as e:
                    error = f"{e.code().name}: {e.details()}"
                with lock:
                    done.append((start, time.monotonic(), error))

        workers = [threading.Thread(target=loop) for _ in range(threads)]
        for w in workers:
            w.start()
        return workers, done


def delta(after, before):
    return {name: after[name] - before[name] for name in after}


def join(workers, timeout=60):
    for w in workers:
        w.join(timeout=timeout)
        assert not w.is_alive(), "a call through HAProxy did not end"


def test_calls_through_haproxy_are_shared_by_both_servers(farm):
    before = farm.answered()
    stot_before = {n: int(s["stot"]) for n, s in farm.haproxy.servers().items()}
    started = time.monotonic()
    workers, done = farm.run_through(threads=2, calls=16)
    join(workers)
    took = time.monotonic() - started
    got = delta(farm.answered(), before)
    stot = {n: int(s["stot"]) - stot_before[n] for n, s in farm.haproxy.servers().items()}
    errors = [e for _, _, e in done if e]
    report(f"a. shared: 16 calls in {took:.1f} s on 2 threads -> per server (its metrics) {got}, "
           f"HAProxy stot {stot}, failed {len(errors)}")
    assert not errors, errors
    assert sum(got.values()) == 16 and stot == got, (got, stot)
    assert min(got.values()) >= 4, f"one server got almost nothing: {got}"


def test_a_busy_server_reports_a_lower_weight_and_gets_fewer_calls(farm):
    busy_name, other = "qpool-1", "qpool-2"
    busy = farm.clients[busy_name]
    # Four calls of about 4 s each: at least three are queued or running for the whole phase,
    # so the busy server's load holds still (they are cancelled at its end).
    per_step = seconds_per_step(busy, **BUSY)
    steps = max(2, min(50, math.ceil(4.0 / per_step)))
    idle = farm.haproxy.wait_for(
        lambda s: ready(s), "both servers idle again at full weight")
    report(f"b. weights when idle: { {n: int(s['weight']) for n, s in idle.items()} }; "
           f"busy calls: {steps} steps of {per_step * 1000:.0f} ms at 256x256x2")
    streams = [busy.inference.Generate(busy.pb2.GenerateRequest(steps=steps, **BUSY), timeout=60)
               for _ in range(4)]
    try:
        lowered = farm.haproxy.wait_for(
            lambda s: int(s[busy_name]["weight"]) <= 30, f"{busy_name}'s weight going down")
        answers = {n: agent_answer(ADDRESSES[n], farm.agent_port) for n in ADDRESSES}
        report(f"b. {busy_name} busy (4 direct calls): HAProxy weights "
               f"{ {n: int(s['weight']) for n, s in lowered.items()} }, agents now {answers}")
        before = farm.answered()
        stot_before = {n: int(s["stot"]) for n, s in farm.haproxy.servers().items()}
        weights = {busy_name: [], other: []}
        phase_end = time.monotonic() + 4
        workers, done = farm.run_through(threads=2, seconds=4)
        while time.monotonic() < phase_end:
            for name, s in farm.haproxy.servers().items():
                weights[name].append(int(s["weight"]))
            time.sleep(0.1)
    finally:
        for stream in streams:
            stream.cancel()  # a balanced call queued behind them runs now
    join(workers)
    got = delta(farm.answered(), before)
    stot = {n: int(s["stot"]) - stot_before[n] for n, s in farm.haproxy.servers().items()}
    errors = [e for _, _, e in done if e]
    summary = {n: f"min {min(w)} mean {sum(w) / len(w):.0f} max {max(w)}"
               for n, w in weights.items()}
    report(f"b. during 4 s of calls on 2 threads: weights {summary}; per server (its metrics) "
           f"{got}, HAProxy stot {stot}, failed {len(errors)}")
    assert not errors, errors
    assert stot == got, (got, stot)
    assert max(weights[busy_name]) < min(weights[other]), summary
    assert got[busy_name] < got[other], got
    assert got[other] >= 4, got


def test_a_draining_server_gets_no_new_calls_and_none_fails(farm):
    draining, other = "qpool-1", "qpool-2"
    server = farm.clients[draining].server
    farm.haproxy.wait_for(ready, "both servers idle again at full weight")
    stot0 = {n: int(s["stot"]) for n, s in farm.haproxy.servers().items()}
    workers, done = farm.run_through(threads=2, seconds=1 + NOTICE_S + 1.5)
    time.sleep(1)
    server.process.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    seen = farm.haproxy.wait_for(lambda s: s[draining]["status"].startswith("DRAIN"),
                                 f"{draining} in DRAIN")
    noticed = time.monotonic() - signalled
    stot_seen = {n: int(s["stot"]) for n, s in seen.items()}
    answer = agent_answer(ADDRESSES[draining], farm.agent_port)  # within the notice
    join(workers)
    end = farm.haproxy.servers()
    stot_end = {n: int(s["stot"]) for n, s in end.items()}
    after = [d for d in done if d[0] > signalled + noticed]
    errors = [e for _, _, e in done if e]
    report(f"c. SIGTERM {draining} during calls on 2 threads: its agent answers '{answer}', "
           f"HAProxy status '{seen[draining]['status']}' after {noticed:.2f} s; calls per "
           f"server before that "
           f"{delta(stot_seen, stot0)}, after it {delta(stot_end, stot_seen)} "
           f"({len(after)} calls started after); {len(done)} calls, failed {len(errors)}")
    assert not errors, errors
    assert answer == "drain", answer
    assert stot_end[draining] == stot_seen[draining], (stot_seen, stot_end)
    assert stot_end[other] - stot_seen[other] >= len(after) > 0, (stot_seen, stot_end, len(after))
    code = server.wait(timeout=30)
    assert code == 0, server.stderr_text()
    assert any("drain notice" in line for line in server.stdout_lines), server.stdout_lines[-20:]
