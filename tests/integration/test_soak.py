"""A bounded soak (on the CPU unless QPOOL_TEST_DEVICE says otherwise): client threads mix every
kind of call against one server for QPOOL_SOAK_SECONDS (default 90) and the server comes out of
it as it went in.

The server holds `tiny` and a second copy, `second`, which the mix loads and unloads while other
calls use it. Each thread draws its calls from its own random.Random with a fixed seed: Generate
(plain, with deadlines of a few milliseconds, cancelled after the first progress event, or
dropped with its whole channel), Encode, ListPipelines, GetMemoryReport, Load/Unload of
`second`, and SetOffloadPolicy/Offload/Onload of `second` where the server supports them on this
device (asked once, after the warm-up; a FAILED_PRECONDITION there leaves them out).

At the end: every call got an answer within its deadline and no thread hung; only the expected
status codes occurred; after unloading everything, no bytes leaked and what stays allocated is
what the warm-up left (on a GPU, its allocator blocks: cuBLAS and cuDNN workspaces); the
process's RSS is within 100 MiB, and its open file descriptors and threads within 4, of what they
were after the warm-up (gRPC's executor threads within gRPC's own bound). The run prints its
numbers (calls per operation and status code, RSS, threads, descriptors before and after).
With QPOOL_TEST_DEVICE=cuda:0 it soaks a GPU.

  QPOOL_SOAK_SECONDS   how long the mix runs (default 90)
  QPOOL_SOAK_THREADS   client threads (default 8)
"""

import collections
import os
import pickle
import random
import re
import threading
import time

import grpc
import pytest

from conftest import Client, parse_samples, scrape, wait_drained

SOAK_SECONDS = float(os.environ.get("QPOOL_SOAK_SECONDS", "90"))
THREADS = int(os.environ.get("QPOOL_SOAK_THREADS", "8"))
SEED = 1234
WARM_UP_SECONDS = 5
CALL_TIMEOUT = 60  # every call's deadline, unless the operation sets a shorter one
RSS_SLACK_MIB = 100
THREAD_SLACK = 4
# gRPC's default executor, which runs the callback API's reactors, adds a thread whenever work
# queues behind a busy one and keeps it for the life of the process, up to twice the number of
# cores (sysconf's configured processors): a bound, not a leak, and reached on a GPU host with
# many cores while the CPU machine's two cores cap it at 4. Its threads are checked against that
# bound; every other thread against the warm-up's count.
GRPC_EXECUTOR = "default-executo"  # "default-executor", cut to the kernel's 15 characters
GRPC_EXECUTOR_MAX = 2 * os.sysconf("SC_NPROCESSORS_CONF")
FD_SLACK = 4

OK = grpc.StatusCode.OK
CANCELLED = grpc.StatusCode.CANCELLED
DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
EXHAUSTED = grpc.StatusCode.RESOURCE_EXHAUSTED

# Operation -> codes it may end with. FAILED_PRECONDITION: `second` unloaded, being loaded or
# busy when a racing call reached it. RESOURCE_EXHAUSTED is accepted from Generate and Encode only
# when its message names the full queue (see full_queue).
EXPECTED = {
    "generate": {OK},
    "generate-second": {OK, PRECONDITION},
    "generate-short-deadline": {OK, DEADLINE},
    "generate-cancelled": {OK, CANCELLED},
    "generate-hang-up": {OK, CANCELLED},
    "encode": {OK},
    "encode-second": {OK, PRECONDITION},
    "list-pipelines": {OK},
    "memory-report": {OK},
    "load-second": {OK, PRECONDITION},
    "unload-second": {OK, PRECONDITION},
    "set-offload-policy": {OK, PRECONDITION},
    # UNAVAILABLE: another offload or onload of the pipeline is under way ("retry shortly").
    "offload": {OK, PRECONDITION, UNAVAILABLE},
    "onload": {OK, PRECONDITION, UNAVAILABLE},
}
QUEUED = {"generate", "generate-second", "generate-short-deadline", "generate-cancelled",
          "generate-hang-up", "encode", "encode-second"}
WEIGHTS = {
    "generate": 20, "generate-second": 6, "generate-short-deadline": 8, "generate-cancelled": 6,
    "generate-hang-up": 1, "encode": 8, "encode-second": 3, "list-pipelines": 8, "memory-report": 6,
    "load-second": 3, "unload-second": 3, "set-offload-policy": 2, "offload": 2, "onload": 2,
}
RESIDENCY_OPS = ("set-offload-policy", "offload", "onload")


@pytest.fixture(scope="module")
def client(make_server):
    # Nothing loaded at start, so the memory baseline is the server's own.
    return make_server(pipelines=("tiny", ("tiny", "second")), load="")


# ------------------------------------------------------------------ the process


def process_stats(server):
    """RSS (MiB), threads (and how many bear each name) and open file descriptors of the server
    process."""
    pid = server.process.pid
    with open(f"/proc/{pid}/status") as f:
        status = f.read()
    names = collections.Counter()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                names[f.read().strip()] += 1
        except OSError:  # the thread ended meanwhile
            pass
    return {
        "rss_mib": int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1)) / 1024,
        "threads": int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1)),
        "thread_names": names,
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


def memory(client):
    report = client.models.GetMemoryReport(client.pb2.GetMemoryReportRequest(), timeout=30)
    samples = parse_samples(scrape(client))
    return {
        "allocated": {d.device: d.allocated_bytes for d in report.devices},
        # What no pipeline holds: on a GPU, the cuBLAS and cuDNN workspaces the first requests
        # allocate through the caching allocator and keep for the life of the process.
        "unattributed": {d.device: d.allocated_bytes - d.pipeline_bytes for d in report.devices},
        "pipelines": sorted(p.name for p in report.pipelines),
        "leaked_bytes_total": report.leaked_bytes_total,
        "leaked_metric": sum(v for (name, _), v in samples.items()
                             if name == "qpool_vram_leaked_bytes_total"),
    }


def active_blocks(client):
    """Sizes of the caching allocator's allocated blocks on every GPU (a Counter; empty on the
    CPU), from the snapshot the server hands PyTorch's memory visualizer: plain lists and dicts."""
    try:
        snapshot = client.models.GetAllocatorSnapshot(
            client.pb2.GetAllocatorSnapshotRequest(), timeout=30)
    except grpc.RpcError as error:
        if error.code() == grpc.StatusCode.FAILED_PRECONDITION:  # no GPU
            return collections.Counter()
        raise
    segments = pickle.loads(snapshot.pickle).get("segments", [])
    return collections.Counter((s["device"], b["size"]) for s in segments for b in s["blocks"]
                               if b["state"] == "active_allocated")


def until(call, timeout=60):
    """Calls `call` until it does not fail with FAILED_PRECONDITION (a racing call's state)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except grpc.RpcError as e:
            if e.code() != PRECONDITION or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def load(client, name):
    return until(lambda: client.models.LoadPipeline(client.pb2.LoadPipelineRequest(name=name),
                                                    timeout=CALL_TIMEOUT))


def unload(client, name):
    return until(lambda: client.models.UnloadPipeline(
        client.pb2.UnloadPipelineRequest(name=name), timeout=CALL_TIMEOUT))


# ------------------------------------------------------------------ the operations


class Mix:
    """The operations a client thread draws from, over one shared channel (plus a channel of
    its own for each hang-up)."""

    def __init__(self, client, pb, operations):
        self.client = client
        self.pb = pb
        self.pb2 = client.pb2
        self.operations = operations
        self.weights = [WEIGHTS[op] for op in operations]

    def run(self, op, rng):
        """Runs `op`; returns (status code, message)."""
        try:
            getattr(self, op.replace("-", "_"))(rng)
            return OK, ""
        except grpc.RpcError as e:
            return e.code(), e.details() or ""

    def request(self, rng, pipeline="tiny", steps=None):
        return self.pb2.GenerateRequest(pipeline=pipeline, prompt=f"soak {rng.randrange(1000)}",
                                        steps=steps or rng.randint(1, 3),
                                        seed=rng.randrange(2**32))

    def finish(self, stream):
        messages = list(stream)
        assert messages[-1].WhichOneof("event") == "result", messages[-1]
        assert messages[-1].result.images[0].png.startswith(b"\x89PNG")

    def generate(self, rng):
        self.finish(self.client.inference.Generate(self.request(rng), timeout=CALL_TIMEOUT))

    def generate_second(self, rng):
        self.finish(self.client.inference.Generate(self.request(rng, "second"),
                                                   timeout=CALL_TIMEOUT))

    def generate_short_deadline(self, rng):
        timeout = rng.uniform(0.002, 0.15)
        self.finish(self.client.inference.Generate(self.request(rng), timeout=timeout))

    def generate_cancelled(self, rng):
        stream = self.client.inference.Generate(self.request(rng, steps=8), timeout=CALL_TIMEOUT)
        first = next(stream)
        assert first.WhichOneof("event") == "progress"
        stream.cancel()
        self.finish(stream)  # raises CANCELLED unless the result was already on its way

    def generate_hang_up(self, rng):
        other = Client(self.client.server, self.pb)
        try:
            stream = other.inference.Generate(self.request(rng, steps=8), timeout=CALL_TIMEOUT)
            assert next(stream).WhichOneof("event") == "progress"
        finally:
            other.close()
        self.finish(stream)

    def encode(self, rng, pipeline="tiny"):
        prompts = [f"soak {i}" for i in range(rng.randint(1, 4))]
        reply = self.client.inference.Encode(
            self.pb2.EncodeRequest(pipeline=pipeline, prompts=prompts), timeout=CALL_TIMEOUT)
        assert reply.embeddings.shape[0] == len(prompts)

    def encode_second(self, rng):
        self.encode(rng, "second")

    def list_pipelines(self, rng):
        names = {p.name for p in self.client.models.ListPipelines(
            self.pb2.ListPipelinesRequest(), timeout=CALL_TIMEOUT).pipelines}
        assert {"tiny", "second"} <= names

    def memory_report(self, rng):
        self.client.models.GetMemoryReport(
            self.pb2.GetMemoryReportRequest(max_events=rng.choice([0, 10])), timeout=CALL_TIMEOUT)

    def load_second(self, rng):
        self.client.models.LoadPipeline(self.pb2.LoadPipelineRequest(name="second"),
                                        timeout=CALL_TIMEOUT)

    def unload_second(self, rng):
        self.client.models.UnloadPipeline(self.pb2.UnloadPipelineRequest(name="second"),
                                          timeout=CALL_TIMEOUT)

    def set_offload_policy(self, rng):
        self.client.models.SetOffloadPolicy(self.pb2.SetOffloadPolicyRequest(
            name="second", policy=self.pb2.OffloadPolicy(policy=rng.choice(["none", "model"]))),
            timeout=CALL_TIMEOUT)

    def offload(self, rng):
        self.client.models.OffloadPipeline(self.pb2.OffloadPipelineRequest(name="second"),
                                           timeout=CALL_TIMEOUT)

    def onload(self, rng):
        self.client.models.OnloadPipeline(self.pb2.OnloadPipelineRequest(name="second"),
                                          timeout=CALL_TIMEOUT)


def residency_support(client):
    """Which of SetOffloadPolicy, Offload and Onload `second` (loaded, idle) accepts here, and
    why each other one is left out."""
    pb2, models = client.pb2, client.models
    probes = {
        "set-offload-policy": lambda: models.SetOffloadPolicy(pb2.SetOffloadPolicyRequest(
            name="second", policy=pb2.OffloadPolicy(policy="model")), timeout=CALL_TIMEOUT),
        "offload": lambda: models.OffloadPipeline(pb2.OffloadPipelineRequest(name="second"),
                                                  timeout=CALL_TIMEOUT),
        "onload": lambda: models.OnloadPipeline(pb2.OnloadPipelineRequest(name="second"),
                                                timeout=CALL_TIMEOUT),
    }
    supported, left_out = [], {}
    for op, probe in probes.items():
        try:
            probe()
            supported.append(op)
        except grpc.RpcError as e:
            assert e.code() == PRECONDITION, f"{op}: {e.code()}: {e.details()}"
            left_out[op] = e.details()
        if op == "set-offload-policy":  # `model` offloads an idle pipeline: back to none before
            reset_policy(client)        # probing Offload, which would find it offloaded
    if "offload" not in supported and "onload" in supported:  # onloading what never leaves
        supported.remove("onload")
        left_out["onload"] = "offload is left out"
    return supported, left_out


def reset_policy(client):
    until(lambda: client.models.SetOffloadPolicy(client.pb2.SetOffloadPolicyRequest(
        name="second", policy=client.pb2.OffloadPolicy(policy="none")), timeout=CALL_TIMEOUT))


Outcome = collections.namedtuple("Outcome", "op code message seconds")


def run_mix(mix, seconds, threads=THREADS, seed=SEED):
    """Runs `threads` client threads for `seconds`; returns their outcomes and the threads that
    did not finish (with the call each was in)."""
    outcomes = []
    current = {}
    end = time.monotonic() + seconds

    def worker(index):
        rng = random.Random(seed + index)
        while time.monotonic() < end:
            op = rng.choices(mix.operations, mix.weights)[0]
            started = time.monotonic()
            current[index] = (op, started)
            code, message = mix.run(op, rng)
            outcomes.append(Outcome(op, code, message, time.monotonic() - started))
        current.pop(index, None)

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=max(0.0, end - time.monotonic()) + CALL_TIMEOUT + 30)
    hung = {i: current.get(i) for i, t in enumerate(workers) if t.is_alive()}
    return outcomes, hung


def full_queue(outcome):
    return outcome.code == EXHAUSTED and outcome.op in QUEUED and "queue" in outcome.message


def table(outcomes):
    counts = collections.Counter((o.op, o.code.name) for o in outcomes)
    slowest = collections.defaultdict(float)
    for o in outcomes:
        slowest[o.op] = max(slowest[o.op], o.seconds)
    lines = [f"  {'operation':26s} {'status':22s} {'calls':>7s}"]
    for (op, code), count in sorted(counts.items()):
        lines.append(f"  {op:26s} {code:22s} {count:7d}")
    lines.append(f"  {'slowest call (s)':26s} " + ", ".join(
        f"{op} {s:.2f}" for op, s in sorted(slowest.items())))
    return "\n".join(lines)


# ------------------------------------------------------------------ the soak


def test_soak(client, pb, capsys):
    server = client.server
    baseline = memory(client)
    assert baseline["pipelines"] == [] and baseline["leaked_bytes_total"] == 0, baseline

    load(client, "tiny")
    load(client, "second")
    supported, left_out = residency_support(client)
    operations = [op for op in WEIGHTS if op not in RESIDENCY_OPS or op in supported]
    mix = Mix(client, pb, operations)

    # Warm-up: every operation once, then the full mix for a few seconds, so that gRPC's
    # threads and the allocator's pools reach their working size before the first measurement.
    rng = random.Random(SEED - 1)
    for op in operations:
        code, message = mix.run(op, rng)
        assert code in EXPECTED[op], f"warm-up {op}: {code}: {message}"
    warm_outcomes, hung = run_mix(mix, WARM_UP_SECONDS, seed=SEED - 1000)
    assert not hung, f"warm-up threads hung in {hung}"
    load(client, "second")
    if "set-offload-policy" in supported:
        reset_policy(client)
    wait_drained(client)
    before = process_stats(server)
    workspaces = memory(client)["unattributed"]
    blocks_before = active_blocks(client)

    def back_to_warm_state():
        """Both loaded, policy none, idle: the state each RSS reading is taken in."""
        load(client, "second")
        if "set-offload-policy" in supported:
            reset_policy(client)
        wait_drained(client)

    # Two halves: the allocator's arenas (one per thread that loads or hashes) keep growing
    # through the first, so a leak is what grows again in the second.
    started = time.monotonic()
    outcomes, hung = run_mix(mix, SOAK_SECONDS / 2)
    back_to_warm_state()
    middle = process_stats(server)
    more, more_hung = run_mix(mix, SOAK_SECONDS / 2, seed=SEED + 100)
    outcomes += more
    hung.update({THREADS + i: v for i, v in more_hung.items()})
    took = time.monotonic() - started

    # Back to the warm-up's state (both loaded, policy none, idle) before measuring again.
    load(client, "second")
    if "set-offload-policy" in supported:
        reset_policy(client)
    wait_drained(client)
    after = process_stats(server)
    deadline = time.monotonic() + 15  # gRPC lets idle threads and closed connections go lazily
    while (after["threads"] > before["threads"] + THREAD_SLACK or
           after["fds"] > before["fds"] + FD_SLACK) and time.monotonic() < deadline:
        time.sleep(0.5)
        after = process_stats(server)

    unloaded = {name: unload(client, name) for name in ("second", "tiny")}
    end = memory(client)
    blocks_end = active_blocks(client)
    released = process_stats(server)

    counts = collections.Counter(o.code for o in outcomes)
    report = [
        f"soak: {len(outcomes)} calls in {took:.1f} s ({len(outcomes) / took:.0f}/s) from "
        f"{THREADS} threads, seed {SEED}; warm-up {len(warm_outcomes)} calls",
        "residency operations: " + (", ".join(supported) or "none") +
        "".join(f"; {op} left out ({why})" for op, why in left_out.items()),
        table(outcomes),
        "  by status: " + ", ".join(f"{c.name} {n}" for c, n in counts.most_common()),
        f"process after warm-up: RSS {before['rss_mib']:.1f} MiB, {before['threads']} threads, "
        f"{before['fds']} fds",
        f"after half the soak:   RSS {middle['rss_mib']:.1f} MiB",
        f"process after soak:    RSS {after['rss_mib']:.1f} MiB, {after['threads']} threads, "
        f"{after['fds']} fds",
        f"after unloading all:   RSS {released['rss_mib']:.1f} MiB, {released['threads']} "
        f"threads, {released['fds']} fds",
        f"memory before loads: {baseline['allocated']}; after unloading all: {end['allocated']}; "
        f"leaked_bytes_total {end['leaked_bytes_total']}, qpool_vram_leaked_bytes_total "
        f"{end['leaked_metric']:.0f}, unload leaked_bytes " +
        ", ".join(f"{name} {r.leaked_bytes}" for name, r in unloaded.items()),
    ]
    with capsys.disabled():
        print("\n" + "\n".join(report))

    # Every check, so that one run reports all that is wrong.
    problems = []

    def check(ok, what):
        if not ok:
            problems.append(what)

    check(not hung, f"client threads hung in (operation, start) {hung}")
    check(outcomes, "no call completed")
    unexpected = [o for o in outcomes if o.code not in EXPECTED[o.op] and not full_queue(o)]
    check(not unexpected, "unexpected status codes: " + repr(collections.Counter(
        (o.op, o.code.name, o.message[:100]) for o in unexpected).most_common(10)))
    late = [o for o in outcomes if o.seconds > CALL_TIMEOUT + 5]
    check(not late, f"calls answered past their deadline: {late[:5]}")
    ran = {o.op for o in outcomes}
    check(ran == set(operations), f"never drawn: {set(operations) - ran}")
    check(counts[OK] > len(outcomes) / 2, f"fewer than half the calls succeeded: {counts}")

    check(end["pipelines"] == [], f"still loaded: {end['pipelines']}")
    check(end["leaked_bytes_total"] == 0 and end["leaked_metric"] == 0,
          f"leaked: MemoryReport {end['leaked_bytes_total']}, metric {end['leaked_metric']}")
    check(all(r.leaked_bytes == 0 for r in unloaded.values()),
          f"unloads leaked {[(n, r.leaked_bytes) for n, r in unloaded.items()]}")
    if blocks_before:
        # A GPU: what survives the unloads must be blocks the warm-up left (cuBLAS and cuDNN
        # workspaces). Allocated minus pipeline bytes is no measure of those there: a pipeline's
        # CUDA graphs count their pools' segments, which hold more than their allocated blocks.
        check(not blocks_end - blocks_before,
              f"allocator blocks (device, bytes) left after unloading everything that the "
              f"warm-up did not leave: {dict(blocks_end - blocks_before)}; allocated "
              f"{end['allocated']} (before any load {baseline['allocated']})")
    else:
        check(end["allocated"] == workspaces,
              f"allocated {end['allocated']}, held by no pipeline after the warm-up {workspaces}"
              f" (before any load {baseline['allocated']})")
    check(after["rss_mib"] <= middle["rss_mib"] + RSS_SLACK_MIB / 2,
          f"RSS grew from {middle['rss_mib']:.1f} to {after['rss_mib']:.1f} MiB in the second "
          f"half (from {before['rss_mib']:.1f} after the warm-up)")
    check(after["rss_mib"] <= before["rss_mib"] + 2 * RSS_SLACK_MIB,
          f"RSS grew from {before['rss_mib']:.1f} to {after['rss_mib']:.1f} MiB")
    executors = after["thread_names"][GRPC_EXECUTOR]
    check(executors <= GRPC_EXECUTOR_MAX,
          f"{executors} gRPC executor threads, above gRPC's bound of {GRPC_EXECUTOR_MAX}")
    others = after["threads"] - executors
    others_before = before["threads"] - before["thread_names"][GRPC_EXECUTOR]
    check(others <= others_before + THREAD_SLACK,
          f"threads other than gRPC's executor grew from {others_before} to {others}: by name, "
          f"{dict(after['thread_names'] - before['thread_names'])} more, "
          f"{dict(before['thread_names'] - after['thread_names'])} fewer")
    check(after["fds"] <= before["fds"] + FD_SLACK,
          f"open file descriptors grew from {before['fds']} to {after['fds']}")
    assert not problems, "\n".join(problems)
