#!/usr/bin/env python3
"""Load generator: drives a running qpool-server with Generate requests and reports throughput,
latency percentiles and where the requests ran.

  bench/loadgen.py --address 127.0.0.1:50051 --pipeline sd15 --concurrency 8 --requests 64 \\
      --warmup 8 --width 512 --height 512 --steps 30 --out /tmp/load.json
  bench/loadgen.py --address 127.0.0.1:50051 --pipeline sd15 --duration 60    # for 60 s
  bench/loadgen.py --address 127.0.0.1:50051 --pipeline sd15 --rate 3 --duration 60  # open loop

Modes (a `Workload` describes one run):
  closed loop  `concurrency` clients, each sending its next request when the previous one ends,
               for `requests` requests or `duration_seconds` (whichever ends first; requests in
               flight at the end are waited for and counted).
  open loop    `rate` > 0: arrivals at exponentially distributed intervals (a Poisson process of
               `rate` requests per second), however many are outstanding; latency then runs
               from the scheduled arrival, so a client that falls behind shows up in it.
Both start with `warmup` requests, not counted, sent in a closed loop with `concurrency` clients
so that every replica of a pool gets some. Failed calls (RESOURCE_EXHAUSTED from a full queue,
UNAVAILABLE, ...) are records with their status code, never exceptions.

As a library: `run_workload(address, Workload(...))` returns a `Run` (per-request `Record`s and
the measured window), `summarize(run)` a JSON-ready dict and `format_table({label: summary})`
the table this script prints. bench/throughput_bench.py and tests/integration/test_loadgen.py
use it that way.

Why grpc.aio and not a thread per client: one event loop holds any number of streams in flight
(threads cost a stack each and contend for the GIL on every progress message, so at a few
hundred clients the client, not the server, would set the pace), and the open loop needs sends
at scheduled times regardless of how many calls are outstanding, which is a timer in the loop
rather than a thread per request.
"""
import argparse
import asyncio
import collections
import dataclasses
import os
import random
import sys
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate_bench import host_info, load_stubs, percentile, write_results  # noqa: E402

CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 256 << 20)]
DEFAULT_PROMPTS = ("a red fox in the snow", "a lighthouse at dusk, oil painting",
                   "a bowl of ramen, studio photo", "a city street in the rain")
SEED_POLICIES = ("sequential", "fixed", "random")


@dataclasses.dataclass
class Workload:
    """What one run sends. Unset image fields (None) take the pipeline's defaults."""
    pipeline: str
    prompts: tuple = DEFAULT_PROMPTS  # request i gets prompts[i % len]
    width: int | None = None
    height: int | None = None
    steps: int | None = None
    scheduler: str = ""               # "" = the pipeline's default
    num_images: int = 1
    seeds: str = "sequential"         # sequential: seed_base + i; fixed: seed_base; random: unset
    seed_base: int = 0
    concurrency: int = 8              # closed-loop clients (and warm-up clients in both modes)
    requests: int | None = 64         # measured requests; None = until duration_seconds
    duration_seconds: float | None = None
    warmup: int = 0                   # requests before the measured window, not counted
    rate: float | None = None         # open loop: Poisson arrivals per second; None = closed loop
    arrival_seed: int = 0             # the open loop's random intervals, for repeatable runs
    timeout_seconds: float = 600      # per request (DEADLINE_EXCEEDED after it)

    def validate(self):
        if self.requests is None and self.duration_seconds is None:
            raise ValueError("a workload needs requests or duration_seconds")
        if self.seeds not in SEED_POLICIES:
            raise ValueError(f"seeds must be one of {SEED_POLICIES}, not {self.seeds!r}")
        if self.concurrency < 1 or (self.rate is not None and self.rate <= 0):
            raise ValueError("concurrency must be >= 1 and rate > 0")
        if not self.prompts:
            raise ValueError("a workload needs at least one prompt")

    def request(self, pb, index):
        """The GenerateRequest of request number `index` (warm-up ones first)."""
        fields = {"pipeline": self.pipeline, "prompt": self.prompts[index % len(self.prompts)],
                  "scheduler": self.scheduler}
        for key in ("width", "height", "steps"):
            if getattr(self, key) is not None:
                fields[key] = getattr(self, key)
        if self.num_images != 1:
            fields["num_images"] = self.num_images
        if self.seeds != "random":
            fields["seed"] = self.seed_base + (index if self.seeds == "sequential" else 0)
        return pb.GenerateRequest(**fields)


@dataclasses.dataclass
class Record:
    """One request as the client saw it, with what the server's result said about it."""
    index: int
    code: str                   # the gRPC status code's name: "OK", "RESOURCE_EXHAUSTED", ...
    start_seconds: float        # when it was sent, from the start of the measured window
    latency_seconds: float = 0.0  # send (open loop: scheduled arrival) to the last message
    queue_seconds: float = 0.0  # result.timings
    total_seconds: float = 0.0
    device: str = ""            # result.device: the replica that ran it
    route: str = ""             # result.route_reason (or .route): why that replica
    batch_size: int = 0         # result.batch_size: requests denoised together (0: unknown)
    images: int = 0
    error: str = ""             # the details of a failed call


@dataclasses.dataclass
class Run:
    """What run_workload measured."""
    workload: Workload
    records: list               # measured requests: completion order (closed), send order (open)
    window_seconds: float       # first send to last completion of the measured requests
    warmup_records: list


def batch_size_of(result):
    """GenerateResult.batch_size, or 0 from a server without it."""
    return result.batch_size if "batch_size" in result.DESCRIPTOR.fields_by_name else 0


def route_of(result):
    """Why the server picked the device (GenerateResult.route), or "" from a server without it."""
    return result.route if "route" in result.DESCRIPTOR.fields_by_name else ""


async def run_workload_async(channel, pb, rpc, workload):
    """Runs `workload` on a grpc.aio channel: warm-up, then the measured requests."""
    workload.validate()
    stub = rpc.InferenceServiceStub(channel)
    origin = time.perf_counter()

    async def send(index, scheduled=None):
        start = time.perf_counter()
        record = Record(index, "OK", start - origin)
        try:
            result = None
            async for message in stub.Generate(workload.request(pb, index),
                                               timeout=workload.timeout_seconds):
                if message.HasField("result"):
                    result = message.result
            if result is None:
                record.code, record.error = "NO_RESULT", "the stream ended without a result"
            else:
                record.queue_seconds = result.timings.queue_seconds
                record.total_seconds = result.timings.total_seconds
                record.device, record.route = result.device, route_of(result)
                record.batch_size = batch_size_of(result)
                record.images = len(result.images)
        except grpc.RpcError as e:  # counted by code: load tests provoke refusals by design
            record.code, record.error = e.code().name, e.details() or ""
        record.latency_seconds = time.perf_counter() - (start if scheduled is None else scheduled)
        return record

    warmup = await closed_loop(send, workload.concurrency, 0, workload.warmup, None)
    origin = time.perf_counter()
    deadline = origin + workload.duration_seconds if workload.duration_seconds else None
    if workload.rate:
        records = await open_loop(send, workload.rate, random.Random(workload.arrival_seed),
                                  workload.warmup, workload.requests, deadline)
    else:
        records = await closed_loop(send, workload.concurrency, workload.warmup,
                                    workload.requests, deadline)
    return Run(workload, records, time.perf_counter() - origin, warmup)


async def closed_loop(send, concurrency, first, count, deadline):
    """`concurrency` clients send requests first, first+1, ... until `count` are sent (None: no
    limit) or `deadline` (perf_counter seconds; None: none) has passed."""
    records, sent = [], 0

    async def client():
        nonlocal sent
        while (count is None or sent < count) and (deadline is None or
                                                   time.perf_counter() < deadline):
            sent += 1  # one event loop: no other client runs between the test and this
            records.append(await send(first + sent - 1))

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return records


async def open_loop(send, rate, rng, first, count, deadline):
    """Sends at Poisson arrival times of `rate` per second until `count` are sent or the next
    arrival falls after `deadline`; waits for every call."""
    calls, at = [], time.perf_counter()
    while count is None or len(calls) < count:
        at += rng.expovariate(rate)
        if deadline is not None and at >= deadline:
            break
        await asyncio.sleep(max(0.0, at - time.perf_counter()))
        calls.append(asyncio.create_task(send(first + len(calls), scheduled=at)))
    return list(await asyncio.gather(*calls))


def run_workload(address, workload, stubs=None):
    """Runs `workload` against the server at `address` (HOST:PORT); returns a Run. `stubs` is
    (qpool_pb2, qpool_pb2_grpc); generated from the proto when not given."""
    pb, rpc = stubs or load_stubs()

    async def main():
        async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
            return await run_workload_async(channel, pb, rpc, workload)

    return asyncio.run(main())


def summarize(run):
    """Throughput over the measured window (OK requests and their images), latency and queue
    percentiles of the OK requests, and counts by status code, device, route and the batch size
    each request ran in."""
    ok = [r for r in run.records if r.code == "OK"]
    window = run.window_seconds
    images = sum(r.images for r in ok)
    summary = {
        "requests": len(run.records), "ok": len(ok), "images": images, "window_seconds": window,
        "throughput_rps": len(ok) / window if window > 0 else 0.0,
        "throughput_images_per_second": images / window if window > 0 else 0.0,
        "codes": dict(collections.Counter(r.code for r in run.records)),
        "devices": dict(sorted(collections.Counter(r.device for r in ok).items())),
        "routes": dict(collections.Counter(r.route for r in ok if r.route)),
        "batch_sizes": dict(sorted(collections.Counter(r.batch_size for r in ok
                                                       if r.batch_size).items())),
        "warmup_codes": dict(collections.Counter(r.code for r in run.warmup_records)),
    }
    if ok:
        latencies = [r.latency_seconds for r in ok]
        queues = [r.queue_seconds for r in ok]
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            summary[f"latency_{name}_seconds"] = percentile(latencies, q)
        summary["latency_max_seconds"] = max(latencies)
        summary["queue_p50_seconds"] = percentile(queues, 0.5)
        summary["queue_p99_seconds"] = percentile(queues, 0.99)
        summary["server_total_p50_seconds"] = percentile([r.total_seconds for r in ok], 0.5)
    return summary


TABLE_COLUMNS = (  # header, width, summary key (seconds shown as ms), format
    ("req/s", 8, "throughput_rps", "{:.3f}"),
    ("img/s", 8, "throughput_images_per_second", "{:.3f}"),
    ("p50 ms", 9, "latency_p50_seconds", "{:.1f}"), ("p90 ms", 9, "latency_p90_seconds", "{:.1f}"),
    ("p99 ms", 9, "latency_p99_seconds", "{:.1f}"), ("max ms", 9, "latency_max_seconds", "{:.1f}"),
    ("queue p50 ms", 12, "queue_p50_seconds", "{:.1f}"),
    ("queue p99 ms", 12, "queue_p99_seconds", "{:.1f}"))


def format_table(summaries):
    """One row per {label: summary}: throughput, latency and queue percentiles (ms), OK of sent,
    then the counts by device and by status code."""
    def counts(d):
        return " ".join(f"{k}={v}" for k, v in d.items()) or "-"

    label_width = max([6] + [len(label) for label in summaries])
    lines = [f"{'config':{label_width}s} {'ok/sent':>9s} " +
             " ".join(f"{header:>{width}s}" for header, width, _, _ in TABLE_COLUMNS) +
             "  devices / codes"]
    for label, s in summaries.items():
        cells = []
        for _, width, key, fmt in TABLE_COLUMNS:
            value = s.get(key)
            if value is not None and key.endswith("_seconds"):
                value *= 1000
            cells.append(f"{fmt.format(value) if value is not None else '-':>{width}s}")
        lines.append(f"{label:{label_width}s} {s['ok']:>4d}/{s['requests']:<4d} " +
                     " ".join(cells) + f"  {counts(s['devices'])} / {counts(s['codes'])}")
    return "\n".join(lines)


def server_devices(models, pb):
    """The server's devices from its memory report: [{"device", "total_bytes"}]."""
    report = models.GetMemoryReport(pb.GetMemoryReportRequest(max_events=0), timeout=60)
    return [{"device": d.device, "total_bytes": d.total_bytes} for d in report.devices]


def workload_from_args(ap, args):
    """A valid Workload from the options add_workload_args defined (else ap.error)."""
    prompts = DEFAULT_PROMPTS
    if args.prompts_file:
        with open(args.prompts_file) as f:
            prompts = tuple(line.strip() for line in f if line.strip())
    if args.requests is not None:
        requests = args.requests
    else:
        requests = None if args.duration else Workload.requests
    workload = Workload(args.pipeline, prompts, width=args.width, height=args.height,
                        steps=args.steps, scheduler=args.scheduler, num_images=args.num_images,
                        seeds=args.seeds, seed_base=args.seed_base, concurrency=args.concurrency,
                        requests=requests, duration_seconds=args.duration, warmup=args.warmup,
                        rate=args.rate, arrival_seed=args.arrival_seed,
                        timeout_seconds=args.timeout)
    try:
        workload.validate()
    except ValueError as e:
        ap.error(str(e))
    return workload


def add_workload_args(ap, pipeline=None, **defaults):
    """The Workload's options on an argparse parser (throughput_bench.py shares them);
    `defaults` override the Workload's own (e.g. width=512)."""
    ap.add_argument("--pipeline", default=pipeline, required=pipeline is None)
    ap.add_argument("--prompts-file", help="prompts, one a line (default: four built-in ones)")
    for key in ("width", "height", "steps"):
        ap.add_argument(f"--{key}", type=int, default=defaults.get(key),
                        help="default: " + (str(defaults[key]) if key in defaults
                                            else "the pipeline's"))
    ap.add_argument("--scheduler", default="")
    ap.add_argument("--num-images", type=int, default=1)
    ap.add_argument("--seeds", choices=SEED_POLICIES, default="sequential")
    ap.add_argument("--seed-base", type=int, default=0)
    ap.add_argument("--concurrency", type=int, default=defaults.get("concurrency", 8),
                    help="closed-loop clients (and warm-up clients)")
    ap.add_argument("--requests", type=int, default=defaults.get("requests"),
                    help=f"measured requests (default {Workload.requests}; with --duration, "
                    "no limit)")
    ap.add_argument("--duration", type=float, help="measured seconds")
    ap.add_argument("--warmup", type=int, default=defaults.get("warmup", 0),
                    help="requests before the measured window, not counted")
    ap.add_argument("--rate", type=float, help="open loop: Poisson arrivals per second")
    ap.add_argument("--arrival-seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per request")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--address", required=True, help="HOST:PORT of a running qpool-server")
    add_workload_args(ap)
    ap.add_argument("--label", default="load", help="the table row's name")
    ap.add_argument("--out", help="JSON file: workload, summary and every request's record")
    args = ap.parse_args()
    workload = workload_from_args(ap, args)
    pb, rpc = load_stubs()
    run = run_workload(args.address, workload, (pb, rpc))
    summary = summarize(run)
    print(format_table({args.label: summary}), flush=True)
    with grpc.insecure_channel(args.address) as channel:
        try:
            devices = server_devices(rpc.ModelServiceStub(channel), pb)
        except grpc.RpcError as e:  # the records say what the server did; keep them
            devices = f"no memory report: {e.code().name}"
    write_results(args.out, {"client": host_info(), "server_devices": devices,
                             "workload": dataclasses.asdict(workload), "summary": summary,
                             "records": [dataclasses.asdict(r) for r in run.records]})
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
