#!/usr/bin/env python3
"""Throughput of one qpool-server under concurrent load, for several pool configurations measured
side by side in one run (one server process, the same workload each time).

  bench/throughput_bench.py --server build/server/qpool-server --repository models \
      --pipeline sd15 --configs 1gpu,2gpu --concurrency 8 --requests 48 \
      --out bench/results/throughput_sd15.json

With `--address HOST:PORT` it drives a server that is already running instead of starting one
(its pipelines as they are, or loaded per `--configs`).

Configurations (applied in the order given, each adding to the previous one's state):
  cpu    one replica on the CPU (a smoke run without a GPU)
  1gpu   one replica on cuda:0
  2gpu   a second replica on cuda:1 (LoadPipeline with an explicit device adds one)

The load is a closed loop: `--concurrency` clients each send their next Generate as soon as the
previous one returns. `Workload` and `run_closed_loop` are the pieces a fuller load-test harness
(open-loop arrivals, prompt mixes, several pipelines) grows from.
"""
import argparse
import dataclasses
import platform
import statistics
import sys
import threading
import time

import grpc

from generate_bench import load_stubs, percentile, start_server, stop_server, write_results

CONFIG_DEVICES = {"cpu": "cpu", "1gpu": "cuda:0", "2gpu": "cuda:1"}


@dataclasses.dataclass
class Workload:
    pipeline: str
    width: int = 512
    height: int = 512
    steps: int = 30
    scheduler: str = ""
    prompts: tuple = ("a red fox in the snow", "a lighthouse at dusk, oil painting",
                      "a bowl of ramen, studio photo", "a city street in the rain")
    concurrency: int = 8
    requests: int = 48  # measured
    warmup: int = 16    # per run, not measured; sent with full concurrency so every replica warms


@dataclasses.dataclass
class Record:
    code: str
    seconds: float
    device: str = ""
    route: str = ""
    queue_seconds: float = 0.0


def generate_once(pb, stub, workload, i):
    request = pb.GenerateRequest(pipeline=workload.pipeline,
                                 prompt=workload.prompts[i % len(workload.prompts)],
                                 width=workload.width, height=workload.height,
                                 steps=workload.steps, seed=i, scheduler=workload.scheduler)
    start = time.perf_counter()
    try:
        result = None
        for message in stub.Generate(request, timeout=600):
            if message.HasField("result"):
                result = message.result
        return Record("OK", time.perf_counter() - start, result.device,
                      getattr(result, "route", ""), result.timings.queue_seconds)
    except grpc.RpcError as e:  # counted by code; load tests see refusals by design
        return Record(e.code().name, time.perf_counter() - start)


def run_closed_loop(pb, stub, workload):
    """Runs warm-up then measured requests with `concurrency` clients; returns (measured records,
    wall seconds of the measured part)."""
    closed_loop(pb, stub, workload, range(10_000, 10_000 + workload.warmup))
    return closed_loop(pb, stub, workload, range(workload.requests))


def closed_loop(pb, stub, workload, indices):
    pending, lock, records = list(reversed(indices)), threading.Lock(), []

    def client():
        while True:
            with lock:
                if not pending:
                    return
                i = pending.pop()
            record = generate_once(pb, stub, workload, i)
            with lock:
                records.append(record)

    threads = [threading.Thread(target=client) for _ in range(workload.concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return records, time.perf_counter() - start


def summarize(records, wall):
    ok = [r for r in records if r.code == "OK"]
    latencies = [r.seconds for r in ok]
    out = {"requests": len(records), "wall_seconds": wall,
           "throughput_rps": len(ok) / wall if wall > 0 else 0.0,
           "codes": {}, "devices": {}, "routes": {}}
    for r in records:
        out["codes"][r.code] = out["codes"].get(r.code, 0) + 1
    for r in ok:
        out["devices"][r.device] = out["devices"].get(r.device, 0) + 1
        out["routes"][r.route] = out["routes"].get(r.route, 0) + 1
    if latencies:
        out.update(latency_p50_seconds=statistics.median(latencies),
                   latency_p90_seconds=percentile(latencies, 0.9),
                   latency_p99_seconds=percentile(latencies, 0.99),
                   latency_max_seconds=max(latencies),
                   queue_p50_seconds=statistics.median(r.queue_seconds for r in ok),
                   queue_p99_seconds=percentile([r.queue_seconds for r in ok], 0.99))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", help="qpool-server binary to start")
    ap.add_argument("--repository", help="model repository of the started server")
    ap.add_argument("--address", help="drive this running server instead (HOST:PORT)")
    ap.add_argument("--pipeline", default="sd15")
    ap.add_argument("--configs", default="1gpu,2gpu")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--height", type=int, default=512)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--cpu-threads", type=int, default=0)
    ap.add_argument("--out")
    args = ap.parse_args()
    if not args.address and not (args.server and args.repository):
        sys.exit("give --server and --repository, or --address of a running server")
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in CONFIG_DEVICES]
    if unknown:
        sys.exit(f"unknown configs {unknown}; known: {sorted(CONFIG_DEVICES)}")

    pb, grpc_pb = load_stubs()
    workload = Workload(args.pipeline, args.width, args.height, args.steps,
                        concurrency=args.concurrency, requests=args.requests, warmup=args.warmup)
    proc, address = None, args.address
    if not address:
        devices = "cpu" if configs == ["cpu"] else "cuda"
        proc, address, _ = start_server(args.server, args.repository, devices, args.cpu_threads,
                                        extra_args=["--max-queue", "1024"])
    results = {"workload": dataclasses.asdict(workload), "configs": {},
               "host": platform.node(), "python": platform.python_version()}
    try:
        channel = grpc.insecure_channel(address)
        models = grpc_pb.ModelServiceStub(channel)
        inference = grpc_pb.InferenceServiceStub(channel)
        for config in configs:
            models.LoadPipeline(pb.LoadPipelineRequest(name=args.pipeline,
                                                       device=CONFIG_DEVICES[config]), timeout=600)
            info = next(p for p in models.ListPipelines(pb.ListPipelinesRequest()).pipelines
                        if p.name == args.pipeline)
            records, wall = run_closed_loop(pb, inference, workload)
            summary = summarize(records, wall)
            summary["replicas"] = [r.device for r in info.replicas]
            results["configs"][config] = summary
            print(f"{config:5s} replicas {','.join(summary['replicas'])}: "
                  f"{summary['throughput_rps']:.3f} req/s, p50 "
                  f"{summary.get('latency_p50_seconds', 0):.3f} s, p99 "
                  f"{summary.get('latency_p99_seconds', 0):.3f} s, devices {summary['devices']}, "
                  f"codes {summary['codes']}", flush=True)
        if "1gpu" in results["configs"] and "2gpu" in results["configs"]:
            ratio = (results["configs"]["2gpu"]["throughput_rps"] /
                     results["configs"]["1gpu"]["throughput_rps"])
            results["two_vs_one_gpu_throughput"] = ratio
            print(f"2 GPUs vs 1: {ratio:.2f}x throughput", flush=True)
        results["gpus"] = [d.device for d in models.GetMemoryReport(
            pb.GetMemoryReportRequest()).devices if d.device.startswith("cuda")]
    finally:
        if proc is not None:
            stop_server(proc)
    write_results(args.out, results)


if __name__ == "__main__":
    main()
