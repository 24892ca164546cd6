#!/usr/bin/env python3
"""Memory soak against a real qpool-server: load/unload a pipeline many times and check that every
byte comes back, compare attributed bytes with the allocator's delta at each load, then drive a
request into out-of-memory and check that it is counted and that the server keeps serving.

  bench/memory_soak.py --server build/server/qpool-server --repository /models \\
      --pipeline sd15-nf4 --device cuda:0 --cycles 200 --out bench/results/memory_soak.json

The out-of-memory step (GPU only) starts a second process that takes all but --oom-headroom-gib of
the GPU's free memory, as another tenant would, then asks for the largest image the manifest
allows. The /metrics lines about memory, requests and events are saved with the results.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import time

import grpc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate_bench import (load_stubs, scrape, stages_dict, start_server,  # noqa: E402
                            stop_server, write_results)

FILLER = """
import sys, time, torch
device, keep = sys.argv[1], int(sys.argv[2])
free, _ = torch.cuda.mem_get_info(torch.device(device))
held = torch.empty(max(free - keep, 0), dtype=torch.uint8, device=device)
print("held", held.numel(), flush=True)
time.sleep(3600)
"""


def stage_medians(stages):
    """The median of each field of LoadStages over the cycles (Note [Load stages])."""
    rows = [stages_dict(s) for s in stages]
    return {f: sorted(r[f] for r in rows)[len(rows) // 2] for f in rows[0]}


def device_stats(models, pb, device):
    for d in models.GetMemoryReport(pb.GetMemoryReportRequest(max_events=0)).devices:
        if d.device == device:
            return d
    sys.exit(f"no device {device} in the memory report")


def attributed_on(info, device):
    return sum(c.weight_bytes + c.quant_state_bytes + c.other_bytes
               for c in info.components if c.device == device)


def generate(inference, pb, **kwargs):
    result = None
    for message in inference.Generate(pb.GenerateRequest(**kwargs)):
        if message.HasField("result"):
            result = message.result
    return result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--repository", required=True)
    ap.add_argument("--pipeline", default="tiny-nf4")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--cycles", type=int, default=200)
    ap.add_argument("--oom-headroom-gib", type=float, default=1.0)
    ap.add_argument("--skip-oom", action="store_true", help="only the load/unload soak")
    ap.add_argument("--max-seconds", type=float, default=0,
                    help="stop the soak after this long (0: run every cycle); the cycles run are "
                         "reported")
    ap.add_argument("--out")
    args = ap.parse_args()

    pb, rpc = load_stubs()
    proc, address, metrics = start_server(args.server, args.repository, args.device, 0,
                                          ["--metrics-listen", "127.0.0.1:0"])
    results = {"pipeline": args.pipeline, "device": args.device, "cycles": args.cycles}
    filler = None
    try:
        channel = grpc.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", 256 << 20)])
        models, inference = rpc.ModelServiceStub(channel), rpc.InferenceServiceStub(channel)
        name, device = args.pipeline, args.device

        models.EmptyCache(pb.EmptyCacheRequest())
        start = device_stats(models, pb, device)
        rounding, leaked, load_seconds, stages = [], 0, [], []
        t0 = time.time()
        cycles_run = 0
        for i in range(args.cycles):
            if args.max_seconds and time.time() - t0 > args.max_seconds:
                break
            cycles_run += 1
            before = device_stats(models, pb, device).allocated_bytes
            loaded = models.LoadPipeline(pb.LoadPipelineRequest(name=name, device=device))
            load_seconds.append(loaded.load_seconds)
            stages.append(loaded.stages)
            delta = device_stats(models, pb, device).allocated_bytes - before
            rounding.append(delta - attributed_on(loaded.pipeline, device))
            unloaded = models.UnloadPipeline(pb.UnloadPipelineRequest(name=name))
            leaked += unloaded.leaked_bytes
            after = device_stats(models, pb, device).allocated_bytes
            if after != before:
                print(f"cycle {i}: allocated {before} -> {after}", flush=True)
        soak_seconds = time.time() - t0
        models.EmptyCache(pb.EmptyCacheRequest())
        end = device_stats(models, pb, device)
        report = models.GetMemoryReport(pb.GetMemoryReportRequest(max_events=0))
        results["soak"] = {
            "cycles_run": cycles_run, "seconds": soak_seconds,
            "load_seconds_median": sorted(load_seconds)[len(load_seconds) // 2],
            "load_stages_median": stage_medians(stages),
            "leaked_bytes_reported_by_unloads": leaked,
            "leaked_bytes_total": report.leaked_bytes_total,
            "allocated_start": start.allocated_bytes, "allocated_end": end.allocated_bytes,
            "reserved_start": start.reserved_bytes, "reserved_end": end.reserved_bytes,
            "allocator_minus_attributed_bytes": {"min": min(rounding), "max": max(rounding)},
            "attributed_bytes": attributed_on(loaded.pipeline, device),
        }
        print(json.dumps(results["soak"], indent=1), flush=True)

        if device.startswith("cuda") and not args.skip_oom:
            models.LoadPipeline(pb.LoadPipelineRequest(name=name, device=device))
            ok = generate(inference, pb, pipeline=name, prompt="a lighthouse at dusk", seed=1)
            filler = subprocess.Popen(
                [sys.executable, "-c", FILLER, device, str(int(args.oom_headroom_gib * 2**30))],
                stdout=subprocess.PIPE, text=True)
            print("filler:", filler.stdout.readline().strip(), flush=True)
            oom = {}
            try:
                generate(inference, pb, pipeline=name, prompt="too big", seed=2, width=1024,
                         height=1024, num_images=4, steps=2)
                oom["big_request"] = "OK (did not run out of memory)"
            except grpc.RpcError as e:
                oom["big_request"] = f"{e.code().name}: {e.details()[:300]}"
            filler.send_signal(signal.SIGTERM)
            filler.wait(timeout=30)
            filler = None
            again = generate(inference, pb, pipeline=name, prompt="a lighthouse at dusk", seed=1)
            oom["next_request_identical"] = again.images[0].png == ok.images[0].png
            oom["events"] = [
                {"kind": e.kind, "outcome": e.outcome, "pipeline": e.pipeline,
                 "allocated_before": e.allocated_before, "allocated_after": e.allocated_after,
                 "message": e.message[:200]}
                for e in models.GetMemoryReport(pb.GetMemoryReportRequest(max_events=50)).events
                if e.kind == "oom"]
            results["oom"] = oom
            print(json.dumps(oom, indent=1), flush=True)
        results["metrics"] = scrape(metrics, (
            "qpool_device_memory_", "qpool_device_ooms_total", "qpool_device_alloc_retries_total",
            "qpool_pipeline_memory_bytes", "qpool_memory_events_total", "qpool_vram_leaked",
            "qpool_requests_total", "qpool_request_peak_memory_bytes_count",
            "qpool_request_peak_memory_bytes_sum", "qpool_pinned_host", "qpool_request_duration_seconds_count"))
        print("\n".join(results["metrics"]), flush=True)
    finally:
        if filler is not None:
            filler.kill()
        stop_server(proc)
    write_results(args.out, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
