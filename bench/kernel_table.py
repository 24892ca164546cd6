#!/usr/bin/env python3
"""Where a profiled batch's device time went: a `--profile-dir` kernel table
(<pipeline>-<n>.kernels.tsv, Note [Batch profiler]) grouped into kinds of work (matrix
products, convolutions, attention, normalisation, rotary embedding, copies, elementwise, and
the passes that quantize w8a8 activations), each with its share and its largest kernels.

    python3 bench/kernel_table.py DIR/flux-bf16-1.kernels.tsv [--top 3] [--json]

Kernels are grouped by their names (cuBLAS, cuDNN, FlashAttention, qpool's and ATen's); a table
written without a GPU lists ATen operators, which nest, so its groups overlap. A compiled
package's Triton kernels are named by Inductor after the operators they fuse
("triton_poi_fused_convolution_silu_3" is the bias and SiLU after a convolution, not one): its
pointwise and reduction kernels are grouped as normalisation when they compute a norm's
statistics and as "generated fused" otherwise; its templates (triton_tem_: a matrix product,
convolution or attention Inductor wrote) by what they compute.
"""

import argparse
import json
import re
import sys

# What a norm's statistics kernels are named: a library's and Inductor's alike.
NORM = r"norm|welford|var_mean|std_mean"
# First match wins: more specific names before the general ones.
GROUPS = (
    # qpool's passes that quantize a w8a8 linear's input rows: alone (QuantizeHeldRowsKernel,
    # QuantizeRowsKernel, the GEGLU's rows among them) or in a norm's kernel (LayerNormKernel
    # whose last template argument, kQuantize, is true; Note [Quantized norm rows]).
    ("quantizing", r"QuantizeHeldRows|QuantizeRowsKernel|LayerNormKernel<[^()]*, true>"),
    ("attention", r"flash|fmha|attention|sdpa|scaled_dot_product|cudnn_generated"),
    ("rotary embedding", r"rope"),
    ("quantized linear", r"w8a8|quantlinear|quant_linear|dequant|nf4|int8|_int_mm"),
    ("convolution", r"conv|fprop|dgrad|wgrad|implicit_gemm"),
    ("matrix product", r"gemm|nvjet|cutlass|cublas|xmma|addmm|\bmm\b|aten::mm|matmul|linear|bmm"),
    ("normalisation", NORM),
    # qpool::cat_gelu's CatGeluKernel (a GELU, though named "Cat") and qpool::geglu's GegluKernel.
    ("elementwise", r"gelu|geglu"),
    ("copy", r"copy|memcpy|memset|cat|concat|contiguous|transpose|permute|clone"),
    ("elementwise", r"elementwise|vectorized|unrolled|reduce|softmax|gelu|silu|add|mul|"
                    r"activation"),
)


# Inductor's generated pointwise, reduction and persistent-reduction kernels.
GENERATED = re.compile(r"triton_(poi|red|per)_")


def kind_of(name):
    """The group of one kernel (or, without a GPU, ATen operator) name."""
    if GENERATED.match(name):
        return "normalisation" if re.search(NORM, name, re.IGNORECASE) else "generated fused"
    if name.startswith("triton_tem_"):
        return ("attention" if "attention" in name else
                "convolution" if "conv" in name else "matrix product")
    return next((g for g, pattern in GROUPS if re.search(pattern, name, re.IGNORECASE)),
                "other")


def read_table(path):
    """(header comment, [(name, calls, total_us)]) of a kernels.tsv."""
    with open(path) as f:
        lines = f.read().splitlines()
    if len(lines) < 2 or not lines[0].startswith("# ") or \
            lines[1] != "name\tcalls\ttotal_us\tmean_us\tshare":
        raise SystemExit(f"{path}: not a --profile-dir kernel table")
    rows = []
    for line in lines[2:]:
        name, calls, total, _, _ = line.split("\t")
        rows.append((name, int(calls), float(total)))
    return lines[0][2:], rows


def group(rows, top):
    """{group: {"us", "share", "calls", "top": [(name, us)]}} ordered by time."""
    total = sum(us for _, _, us in rows) or 1.0
    out = {}
    for name, calls, us in rows:
        kind = kind_of(name)
        entry = out.setdefault(kind, {"us": 0.0, "calls": 0, "top": []})
        entry["us"] += us
        entry["calls"] += calls
        if len(entry["top"]) < top:
            entry["top"].append((name, us))
    for entry in out.values():
        entry["share"] = entry["us"] / total
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["us"]))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("table")
    p.add_argument("--top", type=int, default=3, help="largest kernels shown per group")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = p.parse_args(argv)
    header, rows = read_table(a.table)
    groups = group(rows, a.top)
    if a.json:
        print(json.dumps({"header": header, "groups": groups}, indent=1))
        return 0
    print(header)
    for kind, e in groups.items():
        print(f"{kind:18s} {e['us'] / 1e3:10.2f} ms {100 * e['share']:5.1f}%  {e['calls']} calls")
        for name, us in e["top"]:
            print(f"    {us / 1e3:9.2f} ms  {name[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
