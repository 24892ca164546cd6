#!/usr/bin/env python3
"""End-to-end Generate benchmark: starts qpool-server on a model repository, loads each pipeline
named, and reports per-request latency (p50/p90, per stage) and the bytes each component holds.

  bench/generate_bench.py --server build/server/qpool-server --repository build/test-models \
      --pipelines tiny,tiny-nf4 --requests 10 --out bench/results/generate_cpu.json

Pipelines are measured one after another in one server process, so their numbers compare side by
side on the same device; with --interleave they are all loaded first and take turns round by
round. The first request of each pipeline (of each round) is a warm-up and is not counted.
--client PATH talks to the server through the qpool CLI, on hosts without grpcio.
"""
import argparse
import atexit
import collections
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_stubs():
    from grpc_tools import protoc  # here: the other helpers run where grpcio-tools is missing

    out = tempfile.mkdtemp(prefix="qpool-bench-stubs-")
    proto_dir = os.path.join(ROOT, "proto")
    rc = protoc.main(["protoc", f"-I{proto_dir}", f"-I{os.path.dirname(protoc.__file__)}/_proto",
                      f"--python_out={out}", f"--grpc_python_out={out}",
                      os.path.join(proto_dir, "qpool/v1/qpool.proto")])
    if rc != 0:
        sys.exit("protoc failed")
    sys.path.insert(0, out)
    from qpool.v1 import qpool_pb2, qpool_pb2_grpc  # noqa: E402
    return qpool_pb2, qpool_pb2_grpc


def stages_dict(stages) -> dict:
    """A LoadStages message (Note [Load stages]) as {field: value}."""
    return {field.name: getattr(stages, field.name) for field in stages.DESCRIPTOR.fields}


def start_server(binary, repository, device, cpu_threads, extra_args=()):
    """Starts qpool-server; returns (process, gRPC address, metrics address or None). With
    --http-listen among `extra_args`, process.http_address is the HTTP API's."""
    proc = subprocess.Popen([binary, "--model-repository", repository, "--listen", "127.0.0.1:0",
                             "--device", device, "--log-level", "warn",
                             "--cpu-threads", str(cpu_threads), *extra_args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # A script that dies before stop_server (an RPC error, say) must not leave the server holding
    # its GPU: a later benchmark on that GPU would share it with a stranger.
    atexit.register(_kill_if_running, proc)
    deadline = time.time() + 120
    metrics = None
    while time.time() < deadline:
        line = proc.stdout.readline()
        if "metrics on" in line:
            metrics = line.strip().rsplit(" ", 1)[1]
        if "http on" in line:
            proc.http_address = line.strip().rsplit(" ", 1)[1]
        if "listening on" in line:
            drain_output(proc)
            return proc, line.strip().rsplit(" ", 1)[1], metrics
        if proc.poll() is not None:
            break
    proc.kill()
    sys.exit("qpool-server did not start: " + proc.stderr.read())


def scrape(metrics, prefixes):
    """The sample lines of a server's /metrics (`metrics`: the address start_server returned)
    that start with one of `prefixes`."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=30) as response:
        text = response.read().decode()
    return [line for line in text.splitlines()
            if line.startswith(prefixes) and not line.startswith("#")]


def drain_output(proc):
    """Reads the server's stdout and stderr from here on, keeping their last lines in
    proc.output_tail and counting their bytes in proc.output_bytes[0]: a pipe nobody reads fills
    up and blocks the server's next write."""
    proc.output_tail = collections.deque(maxlen=200)
    proc.output_bytes = [0]

    def drain(stream):
        for line in stream:
            proc.output_tail.append(line)
            proc.output_bytes[0] += len(line)

    for stream in (proc.stdout, proc.stderr):
        threading.Thread(target=drain, args=(stream,), daemon=True).start()


def _kill_if_running(proc):
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=60)


def stop_server(proc):
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


def host_info():
    """The client host, for result files: name, Python, CPU, cores and the GPUs nvidia-smi lists
    (none without it)."""
    info = {"host": platform.node(), "python": platform.python_version(),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    if shutil.which("nvidia-smi"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True)
        info["gpus"] = [dict(zip(("name", "driver", "memory"), line.split(", ")))
                        for line in smi.stdout.splitlines() if line.strip()]
    return info


def write_results(path, results):
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=2)


def summary(seconds):
    """Median, nearest-rank p90 and p99 (the smallest value at least that share of the runs
    reach: with 30 runs p99 is the slowest, never below the median), min and max."""
    seconds = sorted(seconds)

    def rank(q):
        return seconds[max(0, math.ceil(q * len(seconds)) - 1)]

    return {"n": len(seconds), "median_s": statistics.median(seconds), "p90_s": rank(0.9),
            "p99_s": rank(0.99), "min_s": seconds[0], "max_s": seconds[-1]}


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


class GrpcClient:
    """The server's gRPC API through grpcio (stubs compiled from proto/ at start-up)."""

    def __init__(self, address):
        import grpc  # here: CliClient runs where grpcio is missing

        self.pb, rpc = load_stubs()
        channel = grpc.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", 256 << 20)])
        self.models = rpc.ModelServiceStub(channel)
        self.inference = rpc.InferenceServiceStub(channel)

    def load(self, name):
        return self.models.LoadPipeline(self.pb.LoadPipelineRequest(name=name)).load_seconds

    def unload(self, name):
        self.models.UnloadPipeline(self.pb.UnloadPipelineRequest(name=name))

    def set_policy(self, name, policy):
        self.models.SetOffloadPolicy(self.pb.SetOffloadPolicyRequest(
            name=name, policy=self.pb.OffloadPolicy(policy=policy)))

    def generate(self, kwargs, seed):
        """(wall seconds, {device, steps, size, timings}) of one request."""
        t = time.perf_counter()
        result = None
        for message in self.inference.Generate(self.pb.GenerateRequest(seed=seed, **kwargs)):
            if message.HasField("result"):
                result = message.result
        wall = time.perf_counter() - t
        tm = result.timings
        return wall, {"device": result.device, "steps": result.steps,
                      "size": [result.images[0].width, result.images[0].height],
                      "timings": {"queue": tm.queue_seconds, "encode": tm.encode_seconds,
                                  "denoise": tm.denoise_seconds, "decode": tm.decode_seconds}}

    def memory(self, name):
        """(components of `name`, memory of every device) from GetMemoryReport."""
        report = self.models.GetMemoryReport(self.pb.GetMemoryReportRequest())
        components = {c.name: {"quantization": c.quantization, "dtype": c.dtype,
                               "weight_bytes": c.weight_bytes,
                               "quant_state_bytes": c.quant_state_bytes,
                               "other_bytes": c.other_bytes, "graph_bytes": c.graph_bytes}
                      for p in report.pipelines if p.name == name for c in p.components}
        devices = [{"device": d.device, "allocated_bytes": d.allocated_bytes,
                    "reserved_bytes": d.reserved_bytes} for d in report.devices]
        return components, devices


class CliClient:
    """The same calls through the qpool CLI's --json output, for hosts without grpcio. Its wall
    time includes starting the CLI and writing the PNG; the server's stage timings do not."""

    def __init__(self, binary, address):
        self.base = [binary, "--server", address, "--json"]
        self.out = tempfile.mkdtemp(prefix="qpool-bench-images-")

    def _run(self, *args):
        done = subprocess.run([*self.base, *args], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"qpool {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return json.loads(done.stdout)

    def load(self, name):
        return self._run("load", name)["load_seconds"]

    def unload(self, name):
        self._run("unload", name)

    def set_policy(self, name, policy):
        sys.exit("--policies needs grpcio: the CLI does not set offload policies")

    def generate(self, kwargs, seed):
        args = ["generate", "--pipeline", kwargs["pipeline"], "--prompt", kwargs["prompt"],
                "--seed", str(seed), "--out", os.path.join(self.out, "image.png")]
        for key in ("steps", "width", "height"):
            if key in kwargs:
                args += ["--" + key, str(kwargs[key])]
        t = time.perf_counter()
        doc = self._run(*args)
        wall = time.perf_counter() - t
        tm = doc["timings"]
        return wall, {"device": doc["device"], "steps": doc["steps"],
                      "size": [doc["images"][0]["width"], doc["images"][0]["height"]],
                      "timings": {k: tm[k + "_seconds"]
                                  for k in ("queue", "encode", "denoise", "decode")}}

    def memory(self, name):
        report = self._run("memory")
        components = {c["name"]: {k: c[k] for k in ("quantization", "dtype", "weight_bytes",
                                                    "quant_state_bytes", "other_bytes")}
                      for p in report["pipelines"] if p["name"] == name
                      for c in p["components"]}
        devices = [{k: d[k] for k in ("device", "allocated_bytes", "reserved_bytes")}
                   for d in report["devices"]]
        return components, devices


def latency_stats(rows):
    walls = [r["wall"] for r in rows]
    stats = {"requests": len(rows),
             "latency_p50_seconds": statistics.median(walls),
             "latency_p90_seconds": percentile(walls, 0.9),
             "latency_min_seconds": min(walls),
             "stage_median_seconds": {k: statistics.median(r[k] for r in rows)
                                      for k in ("queue", "encode", "denoise", "decode")}}
    served = [sum(r[k] for k in ("queue", "encode", "denoise", "decode")) for r in rows]
    stats["server_p50_seconds"] = statistics.median(served)
    return stats


def measure(client, kwargs, count, rows):
    """One warm-up request, then `count` measured ones appended to rows; the last result."""
    result = None
    for i in range(count + 1):
        wall, result = client.generate(kwargs, i)
        if i > 0:
            rows.append({"wall": wall, **result["timings"]})
    return result


def print_stats(label, entry, stats, components):
    print(f"{label:18s} {entry['device']:7s} {entry['size'][0]}x{entry['size'][1]} "
          f"{entry['steps']:3d} steps  p50 {stats['latency_p50_seconds']*1000:8.1f} ms  "
          f"p90 {stats['latency_p90_seconds']*1000:8.1f} ms  denoise "
          f"{stats['stage_median_seconds']['denoise']*1000:8.1f} ms  "
          f"weights {sum(c['weight_bytes'] for c in components.values())/2**20:8.1f} MiB  "
          f"quant state {sum(c['quant_state_bytes'] for c in components.values())/2**20:6.1f} MiB",
          flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--repository", required=True)
    ap.add_argument("--pipelines", default="tiny")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--cpu-threads", type=int, default=0, help="qpool-server --cpu-threads")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--width", type=int)
    ap.add_argument("--height", type=int)
    ap.add_argument("--policies", help="offload policies to compare, e.g. none,model "
                    "(set with SetOffloadPolicy; the first is the baseline)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="alternate the policies (with --interleave, the pipelines) this many "
                    "times (requests split evenly)")
    ap.add_argument("--interleave", action="store_true",
                    help="load every pipeline first and alternate them round by round, so that "
                    "drift on a shared host hits them alike (the first is the baseline)")
    ap.add_argument("--client", help="talk to the server through this qpool CLI binary instead "
                    "of grpcio")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.interleave and args.policies:
        ap.error("--interleave compares pipelines; --policies compares policies: one at a time")
    if args.client and args.policies:
        ap.error("--policies needs grpcio: the CLI does not set offload policies")

    proc, address, _ = start_server(args.server, args.repository, args.device,
                                     args.cpu_threads)
    results = {**host_info(), "cpu_threads": args.cpu_threads, "requests": args.requests,
               "client": "cli" if args.client else "grpcio", "interleaved": args.interleave,
               "pipelines": {}}
    try:
        client = CliClient(args.client, address) if args.client else GrpcClient(address)
        names = args.pipelines.split(",")
        base_kwargs = {"prompt": "a photo of an astronaut riding a horse on mars"}
        for key in ("steps", "width", "height"):
            if getattr(args, key):
                base_kwargs[key] = getattr(args, key)
        if args.interleave:
            measure_interleaved(client, names, base_kwargs, args, results)
        else:
            for name in names:
                measure_alone(client, name, base_kwargs, args, results)
    finally:
        stop_server(proc)
    write_results(args.out, results)
    return 0


def loaded_entry(client, name, load_seconds, load_wall):
    components, devices = client.memory(name)
    return {"load_seconds": load_seconds, "load_wall_seconds": load_wall,
            "components": components, "device_memory_after_load": devices}


def measure_alone(client, name, base_kwargs, args, results):
    """Loads `name`, measures it under each policy (round by round), unloads it."""
    t0 = time.time()
    load_seconds = client.load(name)
    entry = loaded_entry(client, name, load_seconds, time.time() - t0)
    kwargs = {"pipeline": name, **base_kwargs}
    policies = args.policies.split(",") if args.policies else [None]
    rows = {policy: [] for policy in policies}
    result = None
    # Policies alternate round by round, so drift on a shared host hits them alike.
    for _ in range(args.rounds):
        for policy in policies:
            if policy:
                client.set_policy(name, policy)
            result = measure(client, kwargs, args.requests // args.rounds, rows[policy])
    entry.update({"device": result["device"], "steps": result["steps"],
                  "size": result["size"]})
    for policy in policies:
        stats = latency_stats(rows[policy])
        if policy:
            entry.setdefault("policies", {})[policy] = stats
        else:
            entry.update(stats)
        print_stats(f"{name}@{policy}" if policy else name, entry, stats, entry["components"])
    if len(policies) > 1 and policies[0]:
        base = entry["policies"][policies[0]]["latency_p50_seconds"]
        for policy in policies[1:]:
            ratio = entry["policies"][policy]["latency_p50_seconds"] / base
            entry["policies"][policy]["p50_vs_" + policies[0]] = ratio
            print(f"{name}: p50 {policy} / {policies[0]} = {ratio:.3f}", flush=True)
    results["pipelines"][name] = entry
    client.unload(name)


def measure_interleaved(client, names, base_kwargs, args, results):
    """Loads every pipeline, then runs requests // rounds of each, pipeline after pipeline, round
    after round (each round's first request of a pipeline warms up); ratios to the first."""
    entries, rows = {}, {name: [] for name in names}
    for name in names:
        t0 = time.time()
        load_seconds = client.load(name)
        entries[name] = loaded_entry(client, name, load_seconds, time.time() - t0)
    for _ in range(args.rounds):
        for name in names:
            result = measure(client, {"pipeline": name, **base_kwargs},
                             args.requests // args.rounds, rows[name])
            entries[name].update({"device": result["device"], "steps": result["steps"],
                                  "size": result["size"]})
    for name in names:
        entry = entries[name]
        entry.update(latency_stats(rows[name]))
        base = entries[names[0]]
        for key in ("latency_p50_seconds", "server_p50_seconds"):
            entry[key.replace("_seconds", "_vs_") + names[0]] = entry[key] / base[key]
        entry["denoise_vs_" + names[0]] = (entry["stage_median_seconds"]["denoise"] /
                                           base["stage_median_seconds"]["denoise"])
        print_stats(name, entry, entry, entry["components"])
        print(f"{name}: p50 / {names[0]} = {entry['latency_p50_vs_' + names[0]]:.3f}, "
              f"denoise / {names[0]} = {entry['denoise_vs_' + names[0]]:.3f}", flush=True)
        results["pipelines"][name] = entry
    for name in names:
        client.unload(name)


if __name__ == "__main__":
    sys.exit(main())
