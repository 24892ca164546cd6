#!/usr/bin/env python3
"""How far a batched image is from the same request run alone (dynamic batching, Note [Dynamic
batching] in server/pool/batch_queue.h), on one device.

  bench/batch_identity.py --server build/server/qpool-server --repository models --device cuda:0 \\
      --batched sd15-batch8 --alone sd15 --requests 8 --width 512 --height 512 --steps 30 \\
      --out bench/results/batch_identity.json

`--batched` and `--alone` name two pipelines of the repository with the same files, the first
with `batching.max_batch >= --requests`, the second without batching; the bench loads both on
`--device` of the server it starts (or, with `--address`, of a running server). The bench sends `--requests` different requests (own prompt, seed, guidance) to the
batched pipeline at once, checks that they ran as one batch, sends each again to the unbatched
pipeline, and reports per request: identical PNG bytes or not, the largest and mean absolute
pixel difference (8-bit levels) and the PSNR between the two images, next to the mean difference
between the images of two different requests (what a mixed-up seed or prompt would give).
"""
import argparse
import concurrent.futures
import math
import os
import sys

import grpc

from generate_bench import host_info, load_stubs, start_server, stop_server, write_results

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from png_reader import read_png  # noqa: E402  (the tests' stdlib PNG decoder)


def pixel_stats(a, b):
    """(max, mean) absolute difference of two decoded PNGs of one size, and the PSNR."""
    largest, total, count = 0, 0, 0
    for row_a, row_b in zip(a.rows, b.rows):
        for x, y in zip(row_a, row_b):
            d = abs(x - y)
            largest = max(largest, d)
            total += d
            count += 1
    mse = sum((x - y) ** 2 for row_a, row_b in zip(a.rows, b.rows)
              for x, y in zip(row_a, row_b)) / count
    psnr = math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse)
    return largest, total / count, psnr


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", help="qpool-server binary to start")
    ap.add_argument("--repository", help="model repository of the started server")
    ap.add_argument("--device", default="cuda:0", help="device of the started server")
    ap.add_argument("--address", help="drive this running server instead (HOST:PORT)")
    ap.add_argument("--batched", required=True, help="pipeline with batching on")
    ap.add_argument("--alone", required=True, help="the same model with batching off")
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--width", type=int, default=0)
    ap.add_argument("--height", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--out")
    args = ap.parse_args()
    if not args.address and not (args.server and args.repository):
        ap.error("give --server and --repository, or --address of a running server")
    pb, rpc = load_stubs()
    proc = None
    if not args.address:
        proc, args.address, _ = start_server(args.server, args.repository, args.device, 0)
    try:
        return measure(args, pb, rpc)
    finally:
        if proc is not None:
            stop_server(proc)


def measure(args, pb, rpc):
    requests = [dict(prompt=f"a lighthouse on a cliff, take {i}", seed=9000 + 13 * i,
                     guidance_scale=7.5 if i % 2 == 0 else 4.0, width=args.width,
                     height=args.height, steps=args.steps) for i in range(args.requests)]

    with grpc.insecure_channel(args.address,
                               options=[("grpc.max_receive_message_length", 256 << 20)]) as ch:
        inference = rpc.InferenceServiceStub(ch)
        models = rpc.ModelServiceStub(ch)
        for name in (args.batched, args.alone):
            models.LoadPipeline(pb.LoadPipelineRequest(name=name), timeout=600)

        def generate(pipeline, fields):
            result = None
            for message in inference.Generate(pb.GenerateRequest(pipeline=pipeline, **fields),
                                              timeout=600):
                if message.HasField("result"):
                    result = message.result
            return result

        generate(args.batched, requests[0])  # warm-up: first-use allocations and kernels
        generate(args.alone, requests[0])
        with concurrent.futures.ThreadPoolExecutor(args.requests) as pool:
            batched = list(pool.map(lambda r: generate(args.batched, r), requests))
        alone = [generate(args.alone, r) for r in requests]

    rows = []
    for i, (b, a) in enumerate(zip(batched, alone)):
        largest, mean, psnr = pixel_stats(read_png(b.images[0].png), read_png(a.images[0].png))
        rows.append({"request": i, "batch_size": b.batch_size, "device": b.device,
                     "identical_bytes": b.images[0].png == a.images[0].png,
                     "max_abs_diff": largest, "mean_abs_diff": mean,
                     "psnr_db": psnr if math.isfinite(psnr) else None})
    _, other_mean, other_psnr = pixel_stats(read_png(alone[0].images[0].png),
                                            read_png(alone[1].images[0].png))
    summary = {
        "requests": args.requests, "batch_sizes": sorted({r["batch_size"] for r in rows}),
        "identical": sum(r["identical_bytes"] for r in rows),
        "max_abs_diff": max(r["max_abs_diff"] for r in rows),
        "mean_abs_diff": sum(r["mean_abs_diff"] for r in rows) / len(rows),
        "min_psnr_db": min((r["psnr_db"] for r in rows if r["psnr_db"] is not None),
                           default=None),
        "different_requests_mean_abs_diff": other_mean,
        "different_requests_psnr_db": other_psnr,
    }
    for r in rows:
        psnr = "inf" if r["psnr_db"] is None else f"{r['psnr_db']:.1f}"
        print(f"request {r['request']}: batch {r['batch_size']} on {r['device']}, identical "
              f"{r['identical_bytes']}, max diff {r['max_abs_diff']}, mean diff "
              f"{r['mean_abs_diff']:.4f}, PSNR {psnr} dB")
    print(f"{summary['identical']}/{args.requests} identical; largest difference "
          f"{summary['max_abs_diff']} levels; two different requests differ by "
          f"{other_mean:.1f} levels on average (PSNR {other_psnr:.1f} dB)")
    write_results(args.out, {"client": host_info(), "batched": args.batched,
                             "alone": args.alone, "summary": summary, "rows": rows})
    ok = all(r["batch_size"] == args.requests for r in rows)
    if not ok:
        print("the requests did not run as one batch; raise the batched pipeline's max_batch "
              "or max_delay_ms", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
