#!/usr/bin/env python3
"""Throughput of one qpool-server under concurrent load, for several pool configurations measured
side by side in one run (one server process, the same workload each time).

  bench/throughput_bench.py --server build/server/qpool-server --repository models \\
      --pipeline sd15 --configs 1gpu,2gpu --concurrency 8 --requests 64 \\
      --out bench/results/throughput_sd15.json

With `--address HOST:PORT` it drives a server that is already running instead of starting one.
With `--device cpu` the server runs on the CPU: `1gpu` is then one replica on the CPU (a smoke run
without a GPU) and configurations needing more devices are skipped with a message.

Configurations, applied in the order given (see CONFIGS):
  1gpu   one replica on cuda:0
  Ngpu   replicas on cuda:0 .. cuda:N-1 for N in 2, 4, 8 (LoadPipeline with an explicit device
         adds a replica)
CONFIG@PIPELINE runs CONFIG on another pipeline of the repository, e.g. a copy of the model whose
manifest enables dynamic batching: `--configs 1gpu,1gpu@sd15-batch8` measures batching off and on
side by side (docs/model-repository.md, `batching`).

The load is `qpool bench`'s (the CLI's load test, `--cli`, default $QPOOL_CLI_BIN or
build/client/qpool): a closed loop of `--concurrency` requests in flight after `--warmup`
requests sent the same way (so every replica is warm), or an open loop with `--rate`. Each
configuration's run writes its report (summary.json, requests.csv, memory.csv, report.html) into
`--reports DIR`/CONFIG; this script reads summary.json. Every configuration's throughput is
compared with the first one measured.

Scaling runs: `--concurrency-per-replica 2,4` runs every configuration once per value, with that
many requests in flight per replica (`4gpu` at 2: 8 in flight), for instance

  bench/throughput_bench.py --server build/server/qpool-server --repository models \
      --pipeline sd15 --configs 1gpu,4gpu --concurrency-per-replica 2,4 --duration 60 \
      --out bench/results/throughput_sd15_4gpu.json

Each run of N replicas is then set against N times the one-replica run of the same pipeline and
per-replica concurrency (its scaling efficiency; target 0.9), and against the mean of its own
devices: requests and peak allocated bytes per device (each within 10% of the mean). Requests
that failed are listed by status code; a run with any is flagged. Each device's service time and
busy fraction (from the run's requests.csv: `busy cuda:1=0.85/316ms`) tell a device that ran
slower from one that waited for work. A run during which another process held the GPUs is
flagged DISTURBED (its numbers are not the server's alone) and the bench exits with 1.
"""
import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import grpc

from generate_bench import ROOT, host_info, load_stubs, start_server, stop_server, write_results
from throughput_devices import device_service, gpu_processes, other_processes
from throughput_plot import scaling_svg


@dataclasses.dataclass(frozen=True)
class Config:
    """A pool configuration: the pipeline's replicas on the first `replicas` devices of the
    server's kind, on a server started with `server_args`.

    Extension point: a comparison that needs a server option is a pair of Configs that differ in
    `server_args`; the bench restarts its server only when the next configuration's
    `server_args` differ from the running one's (and refuses such configurations with
    --address). Pipeline options (batching) come from the manifest: CONFIG@PIPELINE.
    """
    replicas: int
    server_args: tuple = ()
    description: str = ""


CONFIGS = {
    "1gpu": Config(1, description="one replica on cuda:0 (on the CPU with --device cpu)"),
    **{f"{n}gpu": Config(n, description=f"replicas on cuda:0 .. cuda:{n - 1}") for n in (2, 4, 8)},
}
TWO_VS_ONE_TARGET = 1.9
EFFICIENCY_TARGET = 0.9  # throughput of N replicas / (N x one replica's), per added GPU
SPREAD_TARGET = 0.10  # requests and peak allocated bytes per device vs their mean
DEFAULT_REQUESTS = 64


def plan_devices(config, kind, gpus):
    """The devices of `config`'s replicas, or (None, why it cannot run here)."""
    if kind == "cpu":
        if config.replicas > 1:
            return None, f"needs {config.replicas} devices; --device cpu has one"
        return ["cpu"], None
    if config.replicas > gpus:
        return None, f"needs {config.replicas} GPUs; the server has {gpus}"
    return [f"cuda:{i}" for i in range(config.replicas)], None


def replica_devices(models, pb, pipeline):
    for info in models.ListPipelines(pb.ListPipelinesRequest(), timeout=60).pipelines:
        if info.name == pipeline:
            return [r.device for r in info.replicas]
    return []


def set_replicas(models, pb, pipeline, devices):
    """Makes the pipeline's replicas exactly `devices`: loads the missing ones one by one
    (LoadPipeline with an explicit device adds a replica), after unloading the pipeline if it
    has replicas elsewhere. Returns the replicas' devices as the server lists them."""
    current = replica_devices(models, pb, pipeline)
    if set(current) - set(devices):
        models.UnloadPipeline(pb.UnloadPipelineRequest(name=pipeline), timeout=600)
        current = []
    for device in devices:
        if device not in current:
            models.LoadPipeline(pb.LoadPipelineRequest(name=pipeline, device=device), timeout=600)
    return replica_devices(models, pb, pipeline)


def add_workload_args(ap):
    """The workload's options, passed on to `qpool bench` (see `qpool bench --help`)."""
    ap.add_argument("--cli", default=os.environ.get("QPOOL_CLI_BIN") or
                    os.path.join(ROOT, "build", "client", "qpool"),
                    help="the qpool CLI (default $QPOOL_CLI_BIN or build/client/qpool)")
    ap.add_argument("--pipeline", default="sd15")
    ap.add_argument("--prompt", help="the prompt (default: qpool bench's built-in ones, in turn)")
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--height", type=int, default=512)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--scheduler")
    ap.add_argument("--num-images", type=int)
    ap.add_argument("--seed", type=int, help="the same seed for every request (default: random)")
    ap.add_argument("--concurrency", type=int, default=8,
                    help="closed loop: requests kept in flight")
    ap.add_argument("--requests", type=int,
                    help=f"measured requests (default {DEFAULT_REQUESTS}; with --duration, no "
                    "limit)")
    ap.add_argument("--duration", type=float, help="measured seconds")
    ap.add_argument("--warmup", default="16",
                    help="requests (N) or seconds (Ns) sent first and not counted (default 16)")
    ap.add_argument("--rate", type=float, help="open loop: arrivals per second")
    ap.add_argument("--arrivals", choices=("poisson", "uniform"), help="open loop's gaps")
    ap.add_argument("--deadline", type=float, default=600,
                    help="seconds per request (default 600: a request the server never answers "
                    "ends the run as DEADLINE_EXCEEDED instead of holding it forever)")
    ap.add_argument("--random-seed", type=int, help="the open loop's random gaps")


def bench_flags(args, concurrency=None):
    """`qpool bench` flags for the workload of `args`, less --pipeline (set per configuration);
    `concurrency` replaces --concurrency."""
    flags = []
    for name in ("prompt", "width", "height", "steps", "scheduler", "num-images", "seed",
                 "requests", "duration", "warmup", "rate", "arrivals", "deadline", "random-seed"):
        value = getattr(args, name.replace("-", "_"))
        if value is not None:
            flags += [f"--{name}", str(value)]
    if args.rate is None:
        flags += ["--concurrency", str(concurrency or args.concurrency)]
    if args.requests is None and args.duration is None:
        flags += ["--requests", str(DEFAULT_REQUESTS)]
    return flags


def check_bench_flags(ap, cli, flags):
    """Lets `qpool bench` check the flags before any server starts: against an address where
    nothing listens it reports a usage error (exit 2) before trying to connect (exit 3)."""
    if not os.access(cli, os.X_OK):
        ap.error(f"no qpool CLI at {cli}: build it (target qpool) or pass --cli")
    probe = subprocess.run([cli, "--server", "127.0.0.1:1", "--connect-timeout", "2", "bench",
                            "--pipeline", "x", *flags], capture_output=True, text=True,
                           timeout=60)
    if probe.returncode == 2:
        ap.error("qpool bench refused the workload: " + probe.stderr.splitlines()[0])


def run_bench(cli, address, pipeline, flags, label, report_dir, timeout):
    """Runs `qpool bench` on `pipeline` at `address`, prints its table and returns its
    summary.json (with its report written into report_dir); None when it has not finished after
    `timeout` seconds (it is killed)."""
    cmd = [cli, "--server", address, "bench", "--pipeline", pipeline, *flags, "--label", label,
           "--out", report_dir]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:  # stderr passes
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return None
    print(out, end="", flush=True)
    if proc.returncode not in (0, 1):  # 1: no request succeeded; the summary's codes say why
        sys.exit(f"qpool bench exited with {proc.returncode}: {' '.join(cmd)}")
    with open(os.path.join(report_dir, "summary.json")) as f:
        return json.load(f)


def run_timeout(args):
    """Seconds a configuration's `qpool bench` may take: its warm-up and window with 300 s to
    spare when both are in seconds, else --run-timeout alone."""
    if args.run_timeout is not None:
        return args.run_timeout
    warmup = float(args.warmup[:-1]) if args.warmup.endswith("s") else None
    if args.duration is None or warmup is None:
        return 3600.0
    return warmup + args.duration + 300.0


def stall_snapshot(rpc, pb, address, server):
    """What the server says when a run stalls: each replica's requests in flight, twice 5 s
    apart (the same numbers twice: nothing finishes), and its last output lines."""
    snapshot = {"replicas": []}
    with grpc.insecure_channel(address) as channel:
        models = rpc.ModelServiceStub(channel)
        for _ in range(2):
            try:
                listed = models.ListPipelines(pb.ListPipelinesRequest(), timeout=30)
                snapshot["replicas"].append(
                    {p.name: [{"device": r.device, "in_flight": r.in_flight,
                               "residency": r.residency} for r in p.replicas]
                     for p in listed.pipelines if p.replicas})
            except grpc.RpcError as e:
                snapshot["replicas"].append(f"ListPipelines failed: {e.code().name}")
            time.sleep(5)
    if server.proc is not None:
        snapshot["server_output_tail"] = list(server.proc.output_tail)[-40:]
    return snapshot


def server_devices(models, pb):
    """The server's devices from its memory report: [{"device", "total_bytes"}]."""
    report = models.GetMemoryReport(pb.GetMemoryReportRequest(max_events=0), timeout=60)
    return [{"device": d.device, "total_bytes": d.total_bytes} for d in report.devices]


def ms(summary, key, stat):
    """A distribution of summary.json in milliseconds, or None when it is empty."""
    dist = summary.get(key)
    return None if not dist else dist[stat] * 1000


TABLE_COLUMNS = (  # header, width, value of a summary.json, format
    ("req/s", 8, lambda s: s["throughput_rps"], "{:.3f}"),
    ("img/s", 8, lambda s: s["throughput_images_per_second"], "{:.3f}"),
    ("p50 ms", 9, lambda s: ms(s, "latency_seconds", "p50"), "{:.1f}"),
    ("p90 ms", 9, lambda s: ms(s, "latency_seconds", "p90"), "{:.1f}"),
    ("p99 ms", 9, lambda s: ms(s, "latency_seconds", "p99"), "{:.1f}"),
    ("max ms", 9, lambda s: ms(s, "latency_seconds", "max"), "{:.1f}"),
    ("queue p50 ms", 12, lambda s: ms(s, "queue_seconds", "p50"), "{:.1f}"),
    ("queue p99 ms", 12, lambda s: ms(s, "queue_seconds", "p99"), "{:.1f}"))


def format_table(summaries):
    """One row per {config: summary.json}: throughput, latency and queue percentiles (ms), OK
    of sent, then the counts by device and by status code."""
    def counts(d):
        return " ".join(f"{k}={v}" for k, v in d.items()) or "-"

    label_width = max([6] + [len(label) for label in summaries])
    lines = [f"{'config':{label_width}s} {'ok/sent':>9s} " +
             " ".join(f"{header:>{width}s}" for header, width, _, _ in TABLE_COLUMNS) +
             "  devices / codes"]
    for label, s in summaries.items():
        cells = []
        for _, width, value_of, fmt in TABLE_COLUMNS:
            value = value_of(s)
            cells.append(f"{fmt.format(value) if value is not None else '-':>{width}s}")
        lines.append(f"{label:{label_width}s} {s['ok']:>4d}/{s['requests']:<4d} " +
                     " ".join(cells) + f"  {counts(s['devices'])} / {counts(s['codes'])}")
    return "\n".join(lines)


def spread(values):
    """The largest distance of `values` from their mean, as a fraction of the mean (0 when they
    are equal; None without values or with a mean of 0)."""
    values = list(values)
    if not values:
        return None
    mean = statistics.fmean(values)
    return max(abs(v - mean) for v in values) / mean if mean > 0 else None


def device_balance(summary):
    """Requests and peak allocated bytes on each of the run's replica devices, and their spreads
    around the mean (a device that served nothing counts 0 requests)."""
    devices = summary["replicas"]
    requests = {d: summary["devices"].get(d, 0) for d in devices}
    peaks = {m["device"]: m["peak_allocated_bytes"]
             for m in summary.get("memory", {}).get("series", []) if m["device"] in devices}
    return {"requests": requests, "requests_spread": spread(requests.values()),
            "peak_allocated_bytes": peaks,
            "peak_allocated_spread": spread(peaks.values()) if len(peaks) == len(devices)
            else None}


def scaling(runs):
    """For every run of several replicas: its throughput against N times the one-replica run of
    the same pipeline and per-replica concurrency (the run's scaling efficiency), or None where
    no such run was measured. `runs` maps labels to summaries carrying "pipeline", "replicas"
    and "per_replica" (the per-replica concurrency, or the total one when it was fixed)."""
    single = {(s["pipeline"], s["per_replica"]): s for s in runs.values()
              if len(s["replicas"]) == 1}
    result = {}
    for label, s in runs.items():
        n = len(s["replicas"])
        base = single.get((s["pipeline"], s["per_replica"]))
        if n < 2 or base is None or base["throughput_rps"] <= 0:
            continue
        result[label] = {"replicas": n, "baseline": base["label"],
                         "speedup": s["throughput_rps"] / base["throughput_rps"],
                         "efficiency": s["throughput_rps"] / (n * base["throughput_rps"])}
    return result


def verdicts(runs, scaled):
    """Lines saying, per run, whether its scaling, balance and errors meet their targets."""
    lines = []
    for label, s in runs.items():
        parts = []
        if label in scaled:
            x = scaled[label]
            parts.append(f"{x['speedup']:.2f}x {x['baseline']} on {x['replicas']} replicas, "
                         f"efficiency {x['efficiency']:.2f} (target {EFFICIENCY_TARGET})")
        balance = s.get("balance")
        if balance and len(s["replicas"]) > 1:
            for key, name in (("requests_spread", "requests"),
                              ("peak_allocated_spread", "peak allocated")):
                if balance[key] is not None:
                    parts.append(f"{name} per device within {balance[key]:.1%} of the mean "
                                 f"(target {SPREAD_TARGET:.0%})")
        service = s.get("device_service") or {}
        if len(service) > 1:
            parts.append("busy " + " ".join(
                f"{d}={x['busy_fraction']:.2f}/{x['service_p50_seconds'] * 1000:.0f}ms"
                for d, x in service.items() if x["busy_fraction"] is not None))
        if s.get("other_gpu_processes"):
            parts.append("DISTURBED by other processes on the GPUs: " + ", ".join(
                f"{p['pid']} {p['name']}" for p in s["other_gpu_processes"]))
        failed = {code: n for code, n in s["codes"].items() if code != "OK"}
        parts.append("errors " + (", ".join(f"{c}={n}" for c, n in failed.items()) if failed
                                  else "none"))
        lines.append(f"{label}: " + "; ".join(parts))
    return lines


class Server:
    """The server the configurations run on: one started here (restarted when a configuration
    needs other flags), or the one at --address."""

    def __init__(self, args):
        self.args, self.proc, self.server_args = args, None, ()
        self.address = args.address

    def ensure(self, server_args):
        """Returns the address of a server with `server_args`, or None (with --address) when
        the running one cannot be given them."""
        if self.args.address:
            return self.address if not server_args else None
        if self.proc is None or server_args != self.server_args:
            self.stop()
            self.proc, self.address, _ = start_server(
                self.args.server, self.args.repository, self.args.device, self.args.cpu_threads,
                extra_args=["--max-queue", str(self.args.max_queue), *server_args])
            self.server_args = server_args
        return self.address

    def output_bytes(self):
        """Bytes the started server has written to stdout and stderr so far (None with
        --address)."""
        return None if self.proc is None else self.proc.output_bytes[0]

    def other_gpu_processes(self):
        """Processes on the GPUs that are not the started server: [] with --address or on the
        CPU, and where nvidia-smi's process ids are not this machine's (in a container it may
        list the host's: then the server itself is not among them and cannot be told apart)."""
        if self.proc is None or self.args.device != "cuda":
            return []
        return other_processes(gpu_processes(), {self.proc.pid}, require=self.proc.pid)

    def stop(self):
        if self.proc is not None:
            stop_server(self.proc)
            self.proc = None


def prepare(server, rpc, pb, args, config, pipeline, results):
    """Starts (or keeps) the server `config` needs and gives `pipeline` its replicas there.
    Returns (address, replicas' devices, None), or (address, None, why the configuration cannot
    run here). Records the server's devices in `results`."""
    address = server.ensure(config.server_args)
    if address is None:
        return None, None, f"needs server flags {' '.join(config.server_args)}; restart the server"
    with grpc.insecure_channel(address) as channel:
        models = rpc.ModelServiceStub(channel)
        results["server_devices"] = server_devices(models, pb)
        gpus = sum(d["device"].startswith("cuda") for d in results["server_devices"])
        devices, why = plan_devices(config, args.device, gpus)
        if why:
            return address, None, why
        try:
            return address, set_replicas(models, pb, pipeline, devices), None
        except grpc.RpcError as e:
            return address, None, f"{pipeline} on {','.join(devices)}: {e.code().name}: " \
                                  f"{e.details()}"


def report(summaries, results, args):
    """Prints the table, every run against the first one and the scaling verdicts; adds the
    scaling to `results` and writes the plot beside --out."""
    print(format_table(summaries))
    baseline = next(iter(summaries))
    results["baseline"] = baseline
    for name, summary in list(summaries.items())[1:]:
        base = summaries[baseline]["throughput_rps"]
        ratio = summary["throughput_rps"] / base if base > 0 else 0.0
        summary["throughput_vs_baseline"] = ratio
        target = (f" (target {TWO_VS_ONE_TARGET}x)"
                  if (baseline, name) == ("1gpu", "2gpu") else "")
        print(f"{name} vs {baseline}: {ratio:.2f}x throughput{target}")
    results["scaling"] = scaling(summaries)
    results["targets"] = {"efficiency": EFFICIENCY_TARGET, "spread": SPREAD_TARGET}
    for line in verdicts(summaries, results["scaling"]):
        print(line)
    svg = scaling_svg(summaries, f"{args.pipeline}: throughput on 1 to N GPUs")
    if svg and args.out:
        results["plot"] = os.path.splitext(args.out)[0] + ".svg"
        with open(results["plot"], "w") as f:
            f.write(svg)
        print(f"plot: {results['plot']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", help="qpool-server binary to start")
    ap.add_argument("--repository", help="model repository of the started server")
    ap.add_argument("--address", help="drive this running server instead (HOST:PORT)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="the server's devices; cpu: one replica on the CPU")
    ap.add_argument("--configs", default="1gpu,2gpu",
                    help="comma-separated, in order: " + ", ".join(CONFIGS))
    add_workload_args(ap)
    ap.add_argument("--concurrency-per-replica", metavar="K[,K...]",
                    help="closed loop: run every configuration once per K with K requests in "
                    "flight per replica (replaces --concurrency)")
    ap.add_argument("--run-timeout", type=float,
                    help="seconds a configuration's load may take before the bench stops, "
                    "recording what the server says (default: warm-up and --duration in "
                    "seconds plus 300, else 3600)")
    ap.add_argument("--cpu-threads", type=int, default=0, help="qpool-server --cpu-threads")
    ap.add_argument("--max-queue", type=int, default=1024, help="qpool-server --max-queue")
    ap.add_argument("--out", help="JSON file: the workload and each configuration's summary "
                    "(rewritten after every run)")
    ap.add_argument("--reports", help="directory for each configuration's qpool bench report "
                    "(default: OUT's name without .json plus -reports, else a temporary one)")
    args = ap.parse_args()
    if not args.address and not (args.server and args.repository):
        ap.error("give --server and --repository, or --address of a running server")
    configs = args.configs.split(",")
    unknown = [c for c in configs if c.split("@")[0] not in CONFIGS]
    if unknown:
        ap.error(f"unknown configs {unknown}; known: {', '.join(CONFIGS)}")
    per_replica = [None]
    if args.concurrency_per_replica:
        if args.rate is not None:
            ap.error("--concurrency-per-replica is for the closed loop; drop --rate")
        try:
            per_replica = [int(k) for k in args.concurrency_per_replica.split(",")]
        except ValueError:
            per_replica = [0]
        if min(per_replica) < 1:
            ap.error("--concurrency-per-replica takes positive integers, e.g. 2,4")
    workload = bench_flags(args)
    check_bench_flags(ap, args.cli, workload)
    reports = args.reports or (os.path.splitext(args.out)[0] + "-reports" if args.out
                               else tempfile.mkdtemp(prefix="qpool-throughput-"))

    pb, rpc = load_stubs()
    results = {"client": host_info(),
               "workload": {"pipeline": args.pipeline, "qpool_bench_flags": workload,
                            "concurrency_per_replica": per_replica[0] and per_replica},
               "device": args.device, "reports": reports, "configs": {}, "complete": False}
    summaries = {}
    timeout = run_timeout(args)
    server = Server(args)
    try:
        for name in configs:
            if "stalled" in results:
                break  # a stalled server's next numbers would mean nothing
            config = CONFIGS[name.split("@")[0]]
            pipeline = name.split("@")[1] if "@" in name else args.pipeline
            address, replicas, why = prepare(server, rpc, pb, args, config, pipeline, results)
            if why:
                print(f"{name}: skipped ({why})", flush=True)
                results["configs"][name] = {"skipped": why}
                continue
            for k in per_replica:
                concurrency = k * len(replicas) if k else args.concurrency
                label = f"{name}-c{concurrency}" if k else name
                flags = bench_flags(args, concurrency) if k else workload
                output_before = server.output_bytes()
                others = server.other_gpu_processes()
                summary = run_bench(args.cli, address, pipeline, flags, label,
                                    os.path.join(reports, label), timeout)
                if summary is None:
                    stalled = stall_snapshot(rpc, pb, address, server)
                    results["configs"][label] = {"stalled": True, **stalled}
                    print(f"{label}: not finished after {timeout:.0f} s; the server "
                          f"says {json.dumps(stalled)}", flush=True)
                    results["stalled"] = label
                    break
                if output_before is not None:  # what the server wrote meanwhile
                    summary["server_output_bytes"] = server.output_bytes() - output_before
                summary.update(config=name, pipeline=pipeline, replicas=replicas,
                               concurrency=concurrency if args.rate is None else None,
                               per_replica=k or f"total {args.concurrency}",
                               server_args=list(config.server_args))
                summary["balance"] = device_balance(summary)
                requests_csv = os.path.join(reports, label, summary["files"]["requests"])
                if os.path.exists(requests_csv):
                    summary["device_service"] = device_service(requests_csv,
                                                               summary["window_seconds"])
                others = other_processes(others + server.other_gpu_processes(), set())
                if others:  # before or after the run: its numbers are not the server's alone
                    summary["other_gpu_processes"] = others
                if set(summary["codes"]) - {"OK"} and server.proc is not None:
                    summary["server_output_tail"] = list(server.proc.output_tail)[-40:]
                results["configs"][label] = summaries[label] = summary
                write_results(args.out, results)
                print(f"{label}: {summary['throughput_rps']:.3f} req/s on {','.join(replicas)}, "
                      f"devices {summary['devices']}, batch sizes {summary['batch_sizes']}, "
                      f"codes {summary['codes']}", flush=True)
    finally:
        server.stop()

    if summaries:
        report(summaries, results, args)
    results["complete"] = "stalled" not in results
    disturbed = [label for label, s in summaries.items() if s.get("other_gpu_processes")]
    if disturbed:
        results["disturbed"] = disturbed
        print(f"other processes held the GPUs during {', '.join(disturbed)}: those numbers are "
              "not the server's alone", flush=True)
    write_results(args.out, results)
    return 0 if summaries and results["complete"] and not disturbed else 1


if __name__ == "__main__":
    sys.exit(main())
