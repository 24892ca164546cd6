#!/usr/bin/env python3
"""How far a quantized pipeline's images move when its linear layers run on another CUDA kernel
path (QPOOL_QUANT_CUDA_PATH, Note [Kernel path override]), next to how far they are from the
full-precision pipeline.

  bench/kernel_path_identity.py --server build/server/qpool-server --client build/client/qpool \\
      --repository models --pipeline sd15-int8 --reference sd15 --paths auto,dequant \\
      --requests 2 --width 512 --height 512 --steps 30 --out bench/results/kernel_path_identity.json

One server per path (the override is read once per process), each on `--device`; the same
requests (own prompt and seed) go through the `qpool` CLI to `--pipeline` on every path and, on
the first server, to `--reference`. Reports per request and pair the largest and mean absolute
pixel difference (8-bit levels) and the PSNR. Needs grpcio only (no generated stubs).
"""
import argparse
import math
import os
import subprocess
import sys
import tempfile

from batch_identity import pixel_stats
from generate_bench import host_info, start_server, stop_server, write_results

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "integration"))
from png_reader import read_png  # noqa: E402  (the tests' stdlib PNG decoder)


def generate_all(client, address, pipelines, requests, out_dir):
    """{pipeline: [PNG bytes per request]} from the server at `address`, through the CLI."""
    os.makedirs(out_dir, exist_ok=True)
    images = {}
    for name in pipelines:
        subprocess.run([client, "--server", address, "load", name], check=True,
                       stdout=subprocess.DEVNULL)
        images[name] = []
        for r, req in enumerate(requests):
            path = os.path.join(out_dir, f"{name}-{r}.png")
            cmd = [client, "--server", address, "generate", "--pipeline", name, "--prompt",
                   req["prompt"], "--seed", str(req["seed"]), "--out", path]
            for flag in ("steps", "width", "height"):
                if req[flag]:
                    cmd += [f"--{flag}", str(req[flag])]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            with open(path, "rb") as f:
                images[name].append(f.read())
    return images


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True, help="qpool-server binary to start")
    ap.add_argument("--client", required=True, help="qpool CLI binary")
    ap.add_argument("--repository", required=True, help="model repository of the servers")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--pipeline", required=True, help="the quantized pipeline")
    ap.add_argument("--reference", help="the same model in full precision")
    ap.add_argument("--paths", default="auto,dequant", help="QPOOL_QUANT_CUDA_PATH values")
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--width", type=int, default=0)
    ap.add_argument("--height", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--out")
    args = ap.parse_args()
    paths = args.paths.split(",")
    requests = [dict(prompt=f"a lighthouse on a cliff, take {i}", seed=4100 + 7 * i,
                     width=args.width, height=args.height, steps=args.steps)
                for i in range(args.requests)]
    images = {}
    out_dir = tempfile.mkdtemp(prefix="qpool-path-identity-")
    for i, path in enumerate(paths):
        os.environ["QPOOL_QUANT_CUDA_PATH"] = path
        proc, address, _ = start_server(args.server, args.repository, args.device, 0)
        try:
            names = [args.pipeline] + ([args.reference] if args.reference and i == 0 else [])
            got = generate_all(args.client, address, names, requests, os.path.join(out_dir, path))
        finally:
            stop_server(proc)
        images[path] = got[args.pipeline]
        if args.reference in got:
            images["reference"] = got[args.reference]

    pairs = [(paths[0], p) for p in paths[1:]]
    if "reference" in images:
        pairs += [(p, "reference") for p in paths]
    rows = []
    for a, b in pairs:
        for r in range(args.requests):
            largest, mean, psnr = pixel_stats(read_png(images[a][r]), read_png(images[b][r]))
            rows.append({"a": a, "b": b, "request": r,
                         "identical_bytes": images[a][r] == images[b][r],
                         "max_abs_diff": largest, "mean_abs_diff": mean,
                         "psnr_db": psnr if math.isfinite(psnr) else None})
            print(f"{args.pipeline} {a} vs {b}, request {r}: max diff {largest}, mean diff "
                  f"{mean:.3f}, PSNR {psnr:.2f} dB")
    write_results(args.out, {"client": host_info(), "pipeline": args.pipeline,
                             "reference": args.reference, "paths": paths,
                             "requests": requests, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
