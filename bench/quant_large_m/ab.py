# Side-by-side timing of builds of this harness's library (build.sh), interleaved per case, against
# F.linear in the activations' dtype: the way to compare two versions of the sm_90a kernel in one run.
# Usage: LIBS=name=path.so,name=path.so [LAYERS=a,b] [MS=1024,4096] [FMTS=int8,nf4,nf4dq]
#        [BNS=256] [SCHED=0] [DTYPE=fp16|bf16] python3 ab.py
#        (SCHED: 0 automatic, 1 data-parallel, 2 stream-K)
# Prints a line per case and writes ab.json to $OUT (or /tmp/out).
import json, os, sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "quant_small_m"))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from qk_common import DEV, SHAPES, Weight, time_fn  # noqa: E402
from qk_large import Library  # noqa: E402


def main():
    libs = {k: Library(v) for k, v in (a.split("=", 1) for a in os.environ["LIBS"].split(","))}
    layers = os.environ.get("LAYERS", "flux_mlp_up_3072x12288,sdxl_ff_1280x10240").split(",")
    ms = [int(v) for v in os.environ.get("MS", "1024,4096").split(",")]
    fmts = os.environ.get("FMTS", "int8,nf4,nf4dq").split(",")
    bns = [int(v) for v in os.environ.get("BNS", "256").split(",")]
    schedules = [int(v) for v in os.environ.get("SCHED", "0").split(",")]
    dtype_name = os.environ.get("DTYPE", "fp16")
    dtype = {"fp16": torch.float16, "bf16": torch.bfloat16}[dtype_name]
    g = torch.Generator(device=DEV)
    g.manual_seed(7)
    rows = []
    for name, k, n in SHAPES:
        if name not in layers:
            continue
        wf = (torch.randn(n, k, device=DEV, generator=g) * 0.05).to(dtype)
        for fmt in fmts:
            w = Weight(n, k, "int8" if fmt == "int8" else "nf4", 64, fmt == "nf4dq", g, ref=False)
            for m in ms:
                x = torch.randn(m, k, device=DEV, generator=g).to(dtype)
                out = torch.empty(m, n, device=DEV, dtype=dtype)
                f = time_fn([lambda: F.linear(x, wf)])
                line = f"{name:26s} {fmt:6s} M={m:5d} {dtype_name} {f:7.1f}us"
                for bn in bns:
                    for sc in schedules:
                        for key, lib in libs.items():
                            t = time_fn([lambda lib=lib: lib.wgmma(w, x, None, out, bn, None, sc)])
                            line += f" | {key}{bn}s{sc} {t / f:.3f}"
                            rows.append(dict(layer=name, fmt=fmt, M=m, dtype=dtype_name, baseline=f, lib=key, bn=bn, sched=sc, us=t))
                print(line, flush=True)
    out_dir = os.environ.get("OUT", "/tmp/out")
    os.makedirs(out_dir, exist_ok=True)
    json.dump(rows, open(os.path.join(out_dir, "ab.json"), "w"), indent=0)


if __name__ == "__main__":
    main()
