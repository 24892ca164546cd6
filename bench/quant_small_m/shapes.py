# Block shapes of the small-M tensor-core kernel (n8 tiles per warp, splits of k over a cluster;
# MmaDevice in server/quant/quant_kernels.h) forced one by one: correctness of
# each against a float32 reference, then the time of each on the benchmark layers next to fp16
# F.linear, to derive the automatic choice (Note [Small-M block shape]). Writes log.txt and
# shapes.json to $OUT. Usage: python3 shapes.py [check|bench|all] [M,M,...] [LIB]
import ctypes, itertools, json, os, sys
import torch
import torch.nn.functional as F

from qk_common import DEV, OUT, SHAPES, ErrorTally, Weight, log, time_fn

HERE = os.path.dirname(os.path.abspath(__file__))
MODE = sys.argv[1] if len(sys.argv) > 1 else "all"
MS = tuple(int(v) for v in sys.argv[2].split(",")) if len(sys.argv) > 2 else (1, 4, 8, 16)
LIB = ctypes.CDLL(os.path.join(HERE, sys.argv[3] if len(sys.argv) > 3 else "libqk_new.so"))
P = ctypes.c_void_p
I = ctypes.c_int
LIB.qk_mma_shape.argtypes = [P, P, ctypes.c_long, P, P, I, I, I, I, I, P]
LIB.qk_supported.argtypes = [P, P, ctypes.c_long, I]
LIB.qk_mma_plan.argtypes = [P, ctypes.c_long, I, I, I, I, I, ctypes.POINTER(ctypes.c_long)]
# The base revision's kernel with its own automatic shape, when built beside it (build.sh).
OLD = None
if os.path.exists(os.path.join(HERE, "libqk_old.so")):
    OLD = ctypes.CDLL(os.path.join(HERE, "libqk_old.so"))
    OLD.qk_mma.argtypes = [P, P, ctypes.c_long, P, P, I, I, I, P]
SMS = torch.cuda.get_device_properties(0).multi_processor_count
TYPE = {torch.float16: 1, torch.bfloat16: 2}
TILES = (2, 4)
SPLITS = (0, 1, 2, 4, 8)


def run(w, x, bias, out, tiles=0, splits=0):
    rc = LIB.qk_mma_shape(w.vp, x.data_ptr(), x.shape[0], bias.data_ptr() if bias is not None else None,
                          out.data_ptr(), TYPE[x.dtype], SMS, 1, tiles, splits,
                          P(torch.cuda.current_stream().cuda_stream))
    assert rc == 0


def plan(w, m, dt=torch.float16):
    """The automatic (tiles, splits, blocks, blocks_per_sm)."""
    out = (ctypes.c_long * 4)()
    assert LIB.qk_mma_plan(w.vp, m, TYPE[dt], SMS, 1, 0, 0, out) == 0
    return list(out)


def run_old(w, x, out):
    assert OLD.qk_mma(w.vp, x.data_ptr(), x.shape[0], None, out.data_ptr(), TYPE[x.dtype], SMS, 1,
                      P(torch.cuda.current_stream().cuda_stream)) == 0


def check():
    g = torch.Generator(device=DEV)
    g.manual_seed(99)
    # (10000, 256) and (20000, 128): more feature blocks than one wave of resident blocks holds
    shapes = [(70, 1536), (9, 8192), (600, 320), (33, 1040), (1000, 1280), (300, 3072), (17, 80),
              (10000, 256), (20000, 128)]
    fmts = [("int8", 64, False), ("nf4", 64, False), ("nf4", 64, True), ("nf4", 16, True), ("nf4", 256, False)]
    tally = ErrorTally(shown=30)
    for (n, k), (fmt, bs, dq) in itertools.product(shapes, fmts):
        if fmt == "nf4" and k % bs:
            continue
        w = Weight(n, k, fmt, bs, dq, g)
        for m, dt in itertools.product((1, 3, 8, 9, 16), (torch.float16, torch.bfloat16)):
            x = torch.randn(m, k, device=DEV, generator=g).to(dt)
            bias = torch.randn(n, device=DEV, generator=g).to(dt) if m % 2 else None
            if LIB.qk_supported(w.vp, x.data_ptr(), m, TYPE[dt]) != 1:
                continue
            ref = x.float() @ w.ref.t() + (bias.float() if bias is not None else 0)
            for tiles, sp in itertools.product(TILES, (0, 3, 8)):
                out = torch.full((m, n), float("nan"), device=DEV, dtype=dt)
                run(w, x, bias, out, tiles, sp)
                torch.cuda.synchronize()
                tally.add(f"{fmt}{'dq' if dq else ''}_{str(dt)[6:]}", out, ref,
                          f"{fmt} bs{bs} dq{dq} {n}x{k} M={m} {dt} tiles={tiles} splits={sp}")
    return tally.report(" shapes")


def bench():
    g = torch.Generator(device=DEV)
    g.manual_seed(7)
    rows = []
    layers = [s for s in SHAPES if os.environ.get("LAYERS", "") in ("", ) or s[0] in os.environ["LAYERS"].split(",")]
    for name, k, n in layers:
        wf = torch.randn(n, k, device=DEV, generator=g).half() * 0.05
        fmts = os.environ.get("FMTS", "int8,nf4,nf4dq").split(",")
        for fmt, dq in [f for f in (("int8", False), ("nf4", False), ("nf4", True)) if f[0] + ("dq" if f[1] else "") in fmts]:
            w = Weight(n, k, fmt, 64, dq, g, ref=False)
            for m in MS:
                x = torch.randn(m, k, device=DEV, generator=g).half()
                out = torch.empty(m, n, device=DEV, dtype=torch.half)
                rec = {"shape": name, "K": k, "N": n, "M": m, "fmt": fmt + ("dq" if dq else ""),
                       "fp16": time_fn([lambda: F.linear(x, wf)]),
                       "auto": time_fn([lambda: run(w, x, None, out)]), "plan": plan(w, m)}
                if OLD is not None:
                    rec["old"] = time_fn([lambda: run_old(w, x, out)])
                for tiles, sp in itertools.product(TILES, SPLITS):
                    rec[f"t{tiles}s{sp}"] = time_fn([lambda: run(w, x, None, out, tiles, sp)])
                best = min((v, kk) for kk, v in rec.items() if kk.startswith("t"))
                old = f" old {rec['old'] / rec['fp16']:.2f}" if "old" in rec else ""
                log(f"{name} {rec['fmt']} M={m}: fp16 {rec['fp16']:.2f} auto {rec['auto']:.2f} "
                    f"({rec['auto'] / rec['fp16']:.2f}) plan {rec['plan']}{old} best {best[1]} {best[0]:.2f} "
                    f"({best[0] / rec['fp16']:.2f})")
                rows.append(rec)
        torch.cuda.empty_cache()
    with open(os.path.join(OUT, "shapes.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    log(torch.cuda.get_device_name(0), torch.__version__)
    ok = True
    if MODE in ("check", "all"):
        ok = check()
    if MODE in ("bench", "all"):
        bench()
    sys.exit(0 if ok else 1)
