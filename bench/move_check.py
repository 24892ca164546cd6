#!/usr/bin/env python3
"""The field report's case at full size, on two GPUs, through a real qpool-server: a quantized
pipeline loaded on cuda:0 and moved to cuda:1 keeps every component (quant state included) on
cuda:1, cuda:0's allocated bytes return to their baseline (the CUDA graphs the pipeline held
there included) and EmptyCache gives its reserved bytes back (and says how many), and the
pipeline generates on cuda:1. Then the pipeline goes
cuda:1 -> cuda:0 -> host (OffloadPipeline) -> cuda:1 (OnloadPipeline) and must give the same PNG
bytes on cuda:1 as before the round trip.

  bench/move_check.py --server build/server/qpool-server --repository /models \\
      --pipelines sd15-nf4,sd15-int8 --out bench/results/move_sd15_h200x2.json

Every check is recorded with its numbers; the exit status is 1 when one fails.
"""
import argparse
import sys
import time

import grpc

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from generate_bench import (host_info, load_stubs, start_server, stop_server,  # noqa: E402
                            write_results)
from memory_soak import attributed_on, device_stats, generate  # noqa: E402

FROM, TO = "cuda:0", "cuda:1"


class Checks:
    def __init__(self):
        self.rows, self.failed = [], 0

    def __call__(self, what, ok, **numbers):
        self.rows.append({"check": what, "ok": bool(ok), **numbers})
        self.failed += not ok
        print(("ok   " if ok else "FAIL ") + what, numbers or "", flush=True)


def image(inference, pb, name, seed, steps):
    result = generate(inference, pb, pipeline=name, prompt="a lighthouse at dusk, oil painting",
                      seed=seed, steps=steps)
    return result.images[0].png


def components(change):
    return {c.name: {"device": c.device, "residency": c.residency,
                     "quant_state_bytes": c.quant_state_bytes}
            for c in change.pipeline.components}


def check_pipeline(models, inference, pb, name, steps, check):
    memory = lambda device: device_stats(models, pb, device)  # noqa: E731
    row = {"pipeline": name}
    # The first generation on a GPU leaves the libraries' per-stream workspaces there for the
    # server's life; they are not the pipeline's, so each baseline follows one load, generation
    # and unload on each GPU.
    for device in (FROM, TO):
        models.LoadPipeline(pb.LoadPipelineRequest(name=name, device=device), timeout=600)
        image(inference, pb, name, 1, steps)
        models.UnloadPipeline(pb.UnloadPipelineRequest(name=name), timeout=600)
    models.EmptyCache(pb.EmptyCacheRequest())
    base = {d: memory(d) for d in (FROM, TO)}
    row["baseline"] = {d: {"allocated": m.allocated_bytes, "reserved": m.reserved_bytes}
                       for d, m in base.items()}

    loaded = models.LoadPipeline(pb.LoadPipelineRequest(name=name, device=FROM), timeout=600)
    on_from = image(inference, pb, name, 7, steps)
    # A second request replays the denoiser's and captures the text encoders' CUDA graphs, so
    # the move below also has graph memory to take off cuda:0.
    check(f"{name}: a second request on {FROM} gives the same PNG bytes",
          image(inference, pb, name, 7, steps) == on_from)
    report = models.GetMemoryReport(pb.GetMemoryReportRequest(max_events=0))
    graphs = {c.name: c.graph_bytes
              for c in next(p for p in report.pipelines if p.name == name).components}
    row["graph_bytes_before_move"] = graphs
    check(f"{name}: every component but the decoder holds CUDA graphs on {FROM}",
          all(b > 0 for c, b in graphs.items() if c != "vae_decoder"), graph_bytes=graphs)
    held = attributed_on(loaded.pipeline, FROM)
    row["attributed_bytes"] = held
    row["allocated_on_from_after_generate"] = memory(FROM).allocated_bytes

    t0 = time.time()
    moved = models.MovePipeline(pb.MovePipelineRequest(name=name, device=TO), timeout=600)
    row["move"] = {"seconds_rpc": time.time() - t0, "seconds": moved.seconds, "bytes": moved.bytes,
                   "tensors_checked": sum(m.tensors_checked for m in moved.moves),
                   "components": components(moved)}
    check(f"{name}: every component on {TO}",
          all(c.device == TO and c.residency == "device" for c in moved.pipeline.components),
          components=row["move"]["components"])
    quantized = [c for c in moved.pipeline.components if c.quantization != "none"]
    check(f"{name}: the quantized components' quant state moved with them",
          quantized and all(c.quant_state_bytes > 0 for c in quantized),
          quantized=[c.name for c in quantized])
    after = memory(FROM)
    check(f"{name}: {FROM} allocated back to its baseline",
          after.allocated_bytes == base[FROM].allocated_bytes,
          allocated=after.allocated_bytes, baseline=base[FROM].allocated_bytes)
    emptied = models.EmptyCache(pb.EmptyCacheRequest())
    reserved = next(d.reserved_bytes for d in emptied.after if d.device == FROM)
    row["empty_cache_released_bytes"] = emptied.released_bytes
    check(f"{name}: EmptyCache released {FROM}'s reserved bytes to its baseline",
          reserved == base[FROM].reserved_bytes, reserved=reserved,
          baseline=base[FROM].reserved_bytes, released=emptied.released_bytes)
    on_to = memory(TO)
    check(f"{name}: {TO} holds the pipeline's attributed bytes",
          on_to.pipeline_bytes == attributed_on(moved.pipeline, TO) == held,
          pipeline_bytes=on_to.pipeline_bytes, attributed=held,
          allocated_above_baseline=on_to.allocated_bytes - base[TO].allocated_bytes)

    on_to_png = image(inference, pb, name, 7, steps)
    check(f"{name}: generates on {TO}", len(on_to_png) > 0, png_bytes=len(on_to_png))
    row["same_png_on_both_gpus"] = on_to_png == on_from
    check(f"{name}: {FROM} still at its baseline after generating on {TO}",
          memory(FROM).allocated_bytes == base[FROM].allocated_bytes,
          allocated=memory(FROM).allocated_bytes)

    models.MovePipeline(pb.MovePipelineRequest(name=name, device=FROM), timeout=600)
    offloaded = models.OffloadPipeline(pb.OffloadPipelineRequest(name=name), timeout=600)
    check(f"{name}: offloaded to the host",
          all(c.residency == "host" for c in offloaded.pipeline.components),
          components=components(offloaded))
    onloaded = models.OnloadPipeline(pb.OnloadPipelineRequest(name=name, device=TO), timeout=600)
    check(f"{name}: onloaded from the host to {TO}",
          all(c.device == TO and c.residency == "device" for c in onloaded.pipeline.components),
          components=components(onloaded))
    round_trip = image(inference, pb, name, 7, steps)
    check(f"{name}: {FROM} -> host -> {TO} gives the same PNG bytes as before on {TO}",
          round_trip == on_to_png, png_bytes=len(round_trip))
    unloaded = models.UnloadPipeline(pb.UnloadPipelineRequest(name=name), timeout=600)
    check(f"{name}: the unload found nothing left", unloaded.leaked_bytes == 0,
          leaked=unloaded.leaked_bytes)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--repository", required=True)
    ap.add_argument("--pipelines", default="sd15-nf4,sd15-int8")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--out")
    args = ap.parse_args()

    pb, rpc = load_stubs()
    proc, address, _ = start_server(args.server, args.repository, "cuda", 0)
    check = Checks()
    results = {"host": host_info(), "steps": args.steps, "pipelines": []}
    try:
        channel = grpc.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", 256 << 20)])
        models, inference = rpc.ModelServiceStub(channel), rpc.InferenceServiceStub(channel)
        names = [d.device for d in models.GetMemoryReport(
            pb.GetMemoryReportRequest(max_events=0)).devices]
        if TO not in names:
            sys.exit(f"needs two GPUs; the server sees {names}")
        for name in filter(None, args.pipelines.split(",")):
            results["pipelines"].append(check_pipeline(models, inference, pb, name, args.steps,
                                                       check))
    finally:
        stop_server(proc)
    results["checks"], results["failed"] = check.rows, check.failed
    write_results(args.out, results)
    print(f"{len(check.rows) - check.failed} of {len(check.rows)} checks passed", flush=True)
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
