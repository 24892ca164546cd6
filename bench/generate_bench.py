#!/usr/bin/env python3
"""End-to-end Generate benchmark: starts qpool-server on a model repository, loads each pipeline
named, and reports per-request latency (p50/p90, per stage) and the bytes each component holds.

  bench/generate_bench.py --server build/server/qpool-server --repository build/test-models \
      --pipelines tiny,tiny-nf4 --requests 10 --out bench/results/generate_cpu.json

Pipelines are measured one after another in one server process, so their numbers compare side by
side on the same device. The first request of each pipeline is a warm-up and is not counted.
"""
import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import grpc

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


def start_server(binary, repository, device, cpu_threads, extra_args=()):
    """Starts qpool-server; returns (process, gRPC address, metrics address or None)."""
    proc = subprocess.Popen([binary, "--model-repository", repository, "--listen", "127.0.0.1:0",
                             "--device", device, "--log-level", "warn",
                             "--cpu-threads", str(cpu_threads), *extra_args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    metrics = None
    while time.time() < deadline:
        line = proc.stdout.readline()
        if "metrics on" in line:
            metrics = line.strip().rsplit(" ", 1)[1]
        if "listening on" in line:
            return proc, line.strip().rsplit(" ", 1)[1], metrics
        if proc.poll() is not None:
            break
    proc.kill()
    sys.exit("qpool-server did not start: " + proc.stderr.read())


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


def percentile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def run_request(pb, inference, kwargs, seed):
    t = time.perf_counter()
    result = None
    for message in inference.Generate(pb.GenerateRequest(seed=seed, **kwargs)):
        if message.HasField("result"):
            result = message.result
    return time.perf_counter() - t, result


def latency_stats(rows):
    walls = [r["wall"] for r in rows]
    return {"requests": len(rows),
            "latency_p50_seconds": statistics.median(walls),
            "latency_p90_seconds": percentile(walls, 0.9),
            "latency_min_seconds": min(walls),
            "stage_median_seconds": {k: statistics.median(r[k] for r in rows)
                                     for k in ("queue", "encode", "denoise", "decode")}}


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
                    help="alternate the policies this many times (requests split evenly)")
    ap.add_argument("--out")
    args = ap.parse_args()

    pb, rpc = load_stubs()
    proc, address, _ = start_server(args.server, args.repository, args.device,
                                     args.cpu_threads)
    results = {**host_info(), "cpu_threads": args.cpu_threads,
               "requests": args.requests, "pipelines": {}}
    try:
        channel = grpc.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", 256 << 20)])
        models, inference = rpc.ModelServiceStub(channel), rpc.InferenceServiceStub(channel)
        for name in args.pipelines.split(","):
            t0 = time.time()
            loaded = models.LoadPipeline(pb.LoadPipelineRequest(name=name))
            load_wall = time.time() - t0
            kwargs = {"pipeline": name, "prompt": "a photo of an astronaut riding a horse on mars"}
            for key in ("steps", "width", "height"):
                if getattr(args, key):
                    kwargs[key] = getattr(args, key)
            policies = args.policies.split(",") if args.policies else [None]
            rows = {policy: [] for policy in policies}
            result = None
            # Policies alternate round by round, so drift on a shared host hits them alike.
            for _ in range(args.rounds):
                for policy in policies:
                    if policy:
                        models.SetOffloadPolicy(pb.SetOffloadPolicyRequest(
                            name=name, policy=pb.OffloadPolicy(policy=policy)))
                    for i in range(args.requests // args.rounds + 1):
                        wall, result = run_request(pb, inference, kwargs, i)
                        if i > 0:  # the first request of a round warms up
                            tm = result.timings
                            rows[policy].append({
                                "wall": wall, "encode": tm.encode_seconds,
                                "denoise": tm.denoise_seconds, "decode": tm.decode_seconds,
                                "queue": tm.queue_seconds})
            report = models.GetMemoryReport(pb.GetMemoryReportRequest())
            components = {}
            for p in report.pipelines:
                if p.name == name:
                    for c in p.components:
                        components[c.name] = {"quantization": c.quantization, "dtype": c.dtype,
                                              "weight_bytes": c.weight_bytes,
                                              "quant_state_bytes": c.quant_state_bytes,
                                              "other_bytes": c.other_bytes}
            device_memory = [{"device": d.device, "allocated_bytes": d.allocated_bytes,
                              "reserved_bytes": d.reserved_bytes} for d in report.devices]
            entry = {
                "device": result.device, "steps": result.steps,
                "size": [result.images[0].width, result.images[0].height],
                "load_seconds": loaded.load_seconds, "load_wall_seconds": load_wall,
                "components": components, "device_memory_after_load": device_memory,
            }
            for policy in policies:
                stats = latency_stats(rows[policy])
                if policy:
                    entry.setdefault("policies", {})[policy] = stats
                else:
                    entry.update(stats)
                label = f"{name}@{policy}" if policy else name
                print(f"{label:18s} {entry['device']:7s} {entry['size'][0]}x{entry['size'][1]} "
                      f"{entry['steps']:3d} steps  p50 {stats['latency_p50_seconds']*1000:8.1f} ms  "
                      f"p90 {stats['latency_p90_seconds']*1000:8.1f} ms  denoise "
                      f"{stats['stage_median_seconds']['denoise']*1000:8.1f} ms  "
                      f"weights {sum(c['weight_bytes'] for c in components.values())/2**20:8.1f} MiB  "
                      f"quant state {sum(c['quant_state_bytes'] for c in components.values())/2**20:6.1f} MiB",
                      flush=True)
            if len(policies) > 1 and policies[0]:
                base = entry["policies"][policies[0]]["latency_p50_seconds"]
                for policy in policies[1:]:
                    ratio = entry["policies"][policy]["latency_p50_seconds"] / base
                    entry["policies"][policy]["p50_vs_" + policies[0]] = ratio
                    print(f"{name}: p50 {policy} / {policies[0]} = {ratio:.3f}", flush=True)
            results["pipelines"][name] = entry
            models.UnloadPipeline(pb.UnloadPipelineRequest(name=name))
    finally:
        stop_server(proc)
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
