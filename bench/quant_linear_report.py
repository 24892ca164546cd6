#!/usr/bin/env python3
"""Markdown tables of a quant_linear_bench JSON (--benchmark_out): ratio to fp16 by M over the
layers, per layer, and (with --previous) the cells that moved by 5% or more since another run.

Usage: python3 bench/quant_linear_report.py RESULTS.json [--previous OLD.json]
"""
import argparse
import json
import re

VARIANTS = ("int8_fp16", "nf4_fp16", "nf4dq_fp16")


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
    args = ap.parse_args()
    new = load(args.results)
    layers = list(dict.fromkeys(k[0] for k in new))
    ms = sorted({k[2] for k in new})
    ratio = lambda cells, l, v, m: cells[(l, v, m)]["ratio_vs_fp16"] if (l, v, m) in cells else None

    print("## Ratio to fp16 by M (range over the layers)\n")
    print("| M | int8 | nf4 | nf4 + double quant |\n| --- | --- | --- | --- |")
    for m in ms:
        cols = []
        for v in VARIANTS:
            rs = [r for r in (ratio(new, l, v, m) for l in layers) if r is not None]
            cols.append(f"{min(rs):.2f}-{max(rs):.2f}" if rs else "")
        print(f"| {m} | " + " | ".join(cols) + " |")

    if args.previous:
        old = load(args.previous)
        print("\n## Changed since the previous run (ratio before → after, cells that moved by 5% or more)\n")
        print("| layer (K x N) | M | int8 | nf4 | nf4 + dq |\n| --- | --- | --- | --- | --- |")
        for l in layers:
            for m in ms:
                cols, moved = [], False
                for v in VARIANTS:
                    a, b = ratio(old, l, v, m), ratio(new, l, v, m)
                    if a is None or b is None:
                        cols.append("")
                    elif abs(b - a) >= 0.05 * a:
                        cols.append(f"{a:.2f} → {b:.2f}")
                        moved = True
                    else:
                        cols.append(f"{b:.2f}")
                if moved:
                    print(f"| {l} | {m} | " + " | ".join(cols) + " |")

    print("\n## Per layer\n")
    print("| layer (K x N) | M | fp16 us | int8 ratio | nf4 ratio | nf4+dq ratio | nf4 GB/s |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for l in layers:
        for m in ms:
            nf4 = new.get((l, "nf4_fp16", m))
            if nf4 is None:
                continue
            cols = [f"{ratio(new, l, v, m):.2f}" if ratio(new, l, v, m) is not None else "" for v in VARIANTS]
            print(f"| {l} | {m} | {nf4['fp16_us']:.1f} | " + " | ".join(cols) + f" | {nf4['weight_GBps']:.0f} |")


if __name__ == "__main__":
    main()
