#!/usr/bin/env python3
"""Markdown tables of a quant_linear_bench JSON (--benchmark_out): ratio to the fp16 (or bf16)
baseline by M over the
layers, per layer, and (with --previous) the cells whose time moved by 5% or more since another
run. A ratio marked † has an fp16 reference, measured inside its benchmark, more than 15% away
from the fp16_linear benchmark of the same layer and M (a disturbed sample or a bimodal cuBLAS
time); "changed" compares absolute times, which do not depend on it.

With --dtype bf16 the same tables for bf16 activations, against bf16 `torch::linear`.

Usage: python3 bench/quant_linear_report.py RESULTS.json [--previous OLD.json] [--dtype bf16]
"""
import argparse
import json
import re


def load(path):
    """{(layer, variant, M): benchmark} of the quant_linear benchmarks of a run."""
    cells = {}
    for b in json.load(open(path))["benchmarks"]:
        m = re.match(r"quant_linear/([^/]+)/([^/]+)/M:(\d+)", b["name"])
        if m:
            cells[(m.group(1), m.group(2), int(m.group(3)))] = b
    return cells


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results")
    ap.add_argument("--previous")
    ap.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16",
                    help="activations (and baseline) of the tables")
    args = ap.parse_args()
    dt = args.dtype
    variants = tuple(f"{f}_{dt}" for f in ("int8", "nf4", "nf4dq"))
    baseline = f"{dt}_linear"
    new = load(args.results)
    layers = list(dict.fromkeys(k[0] for k in new))
    ms = sorted({k[2] for k in new})
    ratio = lambda cells, l, v, m: cells[(l, v, m)][f"ratio_vs_{dt}"] if (l, v, m) in cells else None

    def odd(l, v, m):
        """Whether a cell's reference disagrees with the baseline benchmark's."""
        ref = new.get((l, baseline, m))
        own = new[(l, v, m)][f"{dt}_us"]
        return ref is not None and abs(own - ref["us_per_call"]) > 0.15 * ref["us_per_call"]

    def shown(l, v, m):
        r = ratio(new, l, v, m)
        return "" if r is None else f"{r:.2f}" + (" †" if odd(l, v, m) else "")

    print(f"## Ratio to {dt} by M (range over the layers, † cells left out)\n")
    print("| M | int8 | nf4 | nf4 + double quant |\n| --- | --- | --- | --- |")
    for m in ms:
        cols = []
        for v in variants:
            rs = [ratio(new, l, v, m) for l in layers if (l, v, m) in new and not odd(l, v, m)]
            cols.append(f"{min(rs):.2f}-{max(rs):.2f}" if rs else "")
        print(f"| {m} | " + " | ".join(cols) + " |")

    if args.previous:
        old = load(args.previous)
        print("\n## Changed since the previous run (us per call before → after, cells that moved by 5% or more)\n")
        print("| layer (K x N) | M | int8 | nf4 | nf4 + dq |\n| --- | --- | --- | --- | --- |")
        for l in layers:
            for m in ms:
                cols, moved = [], False
                for v in variants:
                    a, b = old.get((l, v, m)), new.get((l, v, m))
                    if a is None or b is None:
                        cols.append("")
                        continue
                    ta, tb = a["us_per_call"], b["us_per_call"]
                    if abs(tb - ta) >= 0.05 * ta:
                        cols.append(f"{ta:.1f} → {tb:.1f} ({tb / ta:.2f})")
                        moved = True
                    else:
                        cols.append(f"{tb:.1f}")
                if moved:
                    print(f"| {l} | {m} | " + " | ".join(cols) + " |")

    print("\n## Per layer\n")
    print(f"| layer (K x N) | M | {dt} us ({baseline}) | int8 ratio | nf4 ratio | nf4+dq ratio | nf4 GB/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for l in layers:
        for m in ms:
            nf4 = new.get((l, f"nf4_{dt}", m))
            if nf4 is None:
                continue
            cols = [shown(l, v, m) for v in variants]
            base = new.get((l, baseline, m), {"us_per_call": nf4[f"{dt}_us"]})["us_per_call"]
            print(f"| {l} | {m} | {base:.1f} | " + " | ".join(cols) + f" | {nf4['weight_GBps']:.0f} |")


if __name__ == "__main__":
    main()
