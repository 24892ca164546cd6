# Correctness and timing of the tensor-core quant_linear kernels of this checkout ("new", plus any
# other libqk_NAME.so beside it) and of a base revision ("old", see build.sh) against a float32
# reference and fp16/bf16 F.linear, on the benchmark layers of bench/quant_linear_bench.cpp. For
# M > 16 the base path is dequantize + F.linear ("dequant"). Writes log.txt and results.json to
# $OUT (or /tmp/out). Usage: python3 harness.py [check|bench|all] [M,M,...] (default 1,4,16,77).
# Results: bench/results/quant_linear_small_m_*, quant_linear_medium_m_*.
import ctypes, json, math, os, statistics, sys, time
import torch
import torch.nn.functional as F

from qk_common import DEV, OUT, SHAPES, ErrorTally, View, Weight, log, relative_error, time_fn

HERE = os.path.dirname(os.path.abspath(__file__))
MODE = sys.argv[1] if len(sys.argv) > 1 else "all"
# DTYPES=bf16 (or fp16,bf16): the activations timed at every M; by default fp16, and bf16 at M = 1.
DTYPES = [{"fp16": torch.float16, "bf16": torch.bfloat16}[d]
          for d in os.environ.get("DTYPES", "").split(",") if d]


def load(name):
    lib = ctypes.CDLL(os.path.join(HERE, name))
    P = ctypes.c_void_p
    lib.qk_fused.argtypes = [P, P, ctypes.c_long, P, P, ctypes.c_int, P]
    lib.qk_dequant.argtypes = [P, P, ctypes.c_int, P]
    lib.qk_supported.argtypes = [P, P, ctypes.c_long, ctypes.c_int]
    return lib


P = ctypes.c_void_p
NEW = load("libqk_new.so")
OLD = load("libqk_old.so")
# Other builds of the same interface (e.g. experiments) are checked and timed under their names.
CANDS = {"new": NEW}
for f in sorted(os.listdir(HERE)):
    if f.startswith("libqk_") and f.endswith(".so") and f[6:-3] not in ("new", "old"):
        CANDS[f[6:-3]] = load(f)
for lib in list(CANDS.values()) + [OLD]:
    lib.qk_mma.argtypes = [P, P, ctypes.c_long, P, P, ctypes.c_int, ctypes.c_int, ctypes.c_int, P]
MS = tuple(int(v) for v in sys.argv[2].split(",")) if len(sys.argv) > 2 else (1, 4, 16, 77)
PROPS = torch.cuda.get_device_properties(0)
SMS = PROPS.multi_processor_count
TYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def stream():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def run_new(w, x, bias, out, lib=None):
    rc = (lib or NEW).qk_mma(w.vp, x.data_ptr(), x.shape[0], bias.data_ptr() if bias is not None else None,
                    out.data_ptr(), TYPE[x.dtype], SMS, 1, stream())
    assert rc == 0


class Old:
    """The base revision's tensor-core kernel (M <= 16)."""

    def __init__(self, w, m):
        pass

    def __call__(self, w, x, bias, out):
        run_new(w, x, bias, out, OLD)


def run_fused(lib, w, x, bias, out):
    assert lib.qk_fused(w.vp, x.data_ptr(), x.shape[0], bias.data_ptr() if bias is not None else None,
                        out.data_ptr(), TYPE[x.dtype], stream()) == 0


def run_dequant_linear(lib, w, x, bias, wbuf):
    assert lib.qk_dequant(w.vp, wbuf.data_ptr(), TYPE[x.dtype], stream()) == 0
    return F.linear(x, wbuf, bias)


def check(lib=None, name="new"):
    g = torch.Generator(device=DEV)
    g.manual_seed(1234)
    shapes = [(70, 1536), (9, 8192), (600, 320), (33, 1040), (320, 768), (5, 64), (1000, 1280),
              (300, 3072), (4096, 96), (17, 80), (257, 2048), (1280, 10240 // 4)]
    fmts = [("int8", 64, False), ("nf4", 64, False), ("nf4", 64, True), ("nf4", 16, True),
            ("nf4", 16, False), ("nf4", 32, False), ("nf4", 128, True), ("nf4", 256, False)]
    tally = ErrorTally(shown=30)
    worst_old = {}  # the old kernel's error on the same cases, for comparison
    skipped = 0
    for (n, k) in shapes:
        for fmt, bs, dq in fmts:
            if fmt == "nf4" and k % bs:
                continue
            if fmt == "int8" and k % 16:
                continue
            w = Weight(n, k, fmt, bs, dq, g)
            full = (n, k) in [(70, 1536), (9, 8192), (600, 320)]
            ms = list(range(1, 17)) if full else [1, 3, 8, 9, 16]
            ms += [17, 31, 32, 33, 48, 64, 77, 80, 81, 96, 128, 154, 160, 161, 300] if full else [17, 32, 77, 154]
            for m in ms:
                for dt in (torch.float16, torch.bfloat16):
                    x = torch.randn(m, k, device=DEV, generator=g).to(dt)
                    bias = torch.randn(n, device=DEV, generator=g).to(dt) if m % 2 else None
                    if NEW.qk_supported(w.vp, x.data_ptr(), m, TYPE[dt]) != 1:
                        skipped += 1
                        continue
                    ref = x.float() @ w.ref.t()
                    if bias is not None:
                        ref = ref + bias.float()
                    out = torch.full((m, n), float("nan"), device=DEV, dtype=dt)
                    run_new(w, x, bias, out, lib)
                    torch.cuda.synchronize()
                    key = f"{fmt}{'dq' if dq else ''}_bs{bs}_{str(dt)[6:]}_{'m<=16' if m <= 16 else 'm>16'}"
                    tally.add(key, out, ref, f"{name} {fmt} bs{bs} dq{dq} {n}x{k} M={m} {dt}")
                    if m <= 16:
                        o2 = torch.full((m, n), float("nan"), device=DEV, dtype=dt)
                        Old(w, m)(w, x, bias, o2)
                        torch.cuda.synchronize()
                        worst_old[key] = max(worst_old.get(key, 0.0), relative_error(o2, ref)[0])
    for kk, e in sorted(worst_old.items()):
        log(f"worst rel err {kk} of the old kernel: {e:.2e}")
    return tally.report(f" {name}", f" ({skipped} unsupported layouts skipped)")


def bench(shapes=SHAPES, ms=MS, cold=True):
    g = torch.Generator(device=DEV)
    g.manual_seed(7)
    rows = []
    for name, k, n in shapes:
        fp16_bytes = n * k * 2
        wf = torch.randn(n, k, device=DEV, generator=g).half() * 0.05
        variants = {}
        for fmt, dq in (("int8", False), ("nf4", False), ("nf4", True)):
            copies = max(1, min(1500, math.ceil(150e6 / (n * k * (1 if fmt == "int8" else 0.5)))))
            ws = [Weight(n, k, fmt, 64, dq, g, ref=False) for _ in range(copies if cold else 1)]
            variants[fmt + ("dq" if dq else "")] = ws
        fcopies = max(1, min(1500, math.ceil(150e6 / fp16_bytes)))
        wfs = [wf.clone() for _ in range(fcopies if cold else 1)]
        for m in ms:
            for dt in DTYPES or ((torch.float16,) if m != 1 else (torch.float16, torch.bfloat16)):
                x = torch.randn(m, k, device=DEV, generator=g).to(dt)
                wfd = [t.to(dt) for t in wfs] if dt != torch.float16 else wfs
                out = torch.empty(m, n, device=DEV, dtype=dt)
                rec = {"shape": name, "K": k, "N": n, "M": m, "dtype": str(dt)[6:]}
                for temp in (("warm", "cold") if cold else ("warm",)):
                    pick = (lambda lst: lst) if temp == "cold" else (lambda lst: lst[:1])
                    rec[f"fp16_{temp}"] = time_fn([lambda t=t: F.linear(x, t) for t in pick(wfd)])
                    for key, ws in variants.items():
                        wl = pick(ws)
                        wbuf = torch.empty(n, k, device=DEV, dtype=dt)
                        if m <= 16:
                            for cn, cl in CANDS.items():
                                rec[f"{key}_{cn}_{temp}"] = time_fn([lambda w=w, cl=cl: run_new(w, x, None, out, cl) for w in wl])
                            olds = [Old(w, m) for w in wl[:1]]
                            if key == "int8" and m == 1:
                                rec[f"{key}_old_{temp}"] = time_fn([lambda w=w: run_fused(OLD, w, x, None, out) for w in wl])
                            else:
                                rec[f"{key}_old_{temp}"] = time_fn([lambda w=w: olds[0](w, x, None, out) for w in wl])
                            if m <= 4 and temp == "warm":
                                rec[f"{key}_fused_{temp}"] = time_fn([lambda w=w: run_fused(NEW, w, x, None, out) for w in wl])
                        else:
                            for cn, cl in CANDS.items():
                                rec[f"{key}_{cn}_{temp}"] = time_fn([lambda w=w, cl=cl: run_new(w, x, None, out, cl) for w in wl])
                            rec[f"{key}_dequant_{temp}"] = time_fn([lambda w=w: run_dequant_linear(NEW, w, x, None, wbuf) for w in wl])
                    rec["nf4_bytes"] = variants["nf4"][0].nbytes
                rows.append(rec)
                log(json.dumps({kk: (round(v, 2) if isinstance(v, float) else v) for kk, v in rec.items()}))
        del variants, wfs
        torch.cuda.empty_cache()
    return rows


def summary(rows, c):
    log(f"\n[{c}] shape | M | dt | fp16 us | nf4 new/old us | ratio new (old) | nf4dq ratio | int8 ratio | cold: fp16, nf4 ratio")
    for r in rows:
        if r["M"] > 16:
            f = r["fp16_warm"]
            log(f"{r['shape']} | {r['M']} | {r['dtype']} | {f:.1f} | " + " | ".join(
                f"{v} {r[f'{v}_{c}_warm']/f:.2f} ({r[f'{v}_dequant_warm']/f:.2f})" for v in ("nf4", "nf4dq", "int8"))
                + f" | cold {r.get('fp16_cold', 0):.1f} nf4 {r.get(f'nf4_{c}_cold', 0)/max(r.get('fp16_cold', 1), 1e-9):.2f}"
                f" ({r.get('nf4_dequant_cold', 0)/max(r.get('fp16_cold', 1), 1e-9):.2f})")
            continue
        f = r["fp16_warm"]
        log(f"{r['shape']} | {r['M']} | {r['dtype']} | {f:.1f} | {r[f'nf4_{c}_warm']:.1f}/{r['nf4_old_warm']:.1f} | "
            f"{r[f'nf4_{c}_warm']/f:.2f} ({r['nf4_old_warm']/f:.2f}) | {r[f'nf4dq_{c}_warm']/f:.2f} ({r['nf4dq_old_warm']/f:.2f}) | "
            f"{r[f'int8_{c}_warm']/f:.2f} ({r['int8_old_warm']/f:.2f}) | cold {r.get('fp16_cold', 0):.1f} {r.get(f'nf4_{c}_cold', 0)/max(r.get('fp16_cold', 1),1e-9):.2f}")


if __name__ == "__main__":
    log(f"device {PROPS.name} sms {SMS} torch {torch.__version__} cuda {torch.version.cuda}")
    oks = {name: check(lib, name) for name, lib in CANDS.items()} if MODE in ("all", "check") else {}
    if MODE in ("all", "bench"):
        t0 = time.time()
        # two rounds; each entry keeps the lower of its two medians (guards against a disturbed round)
        cold = os.environ.get("COLD", "1") == "1"  # COLD=0: L2-warm weights only
        rows = bench(cold=cold)
        rows2 = bench(cold=cold)
        for r, r2 in zip(rows, rows2):
            for kk, vv in r2.items():
                if isinstance(vv, float):
                    r[kk + "_r2"] = vv
                    r[kk] = min(r[kk], vv)
        json.dump({"device": PROPS.name, "torch": torch.__version__, "cuda": torch.version.cuda, "M": MS,
                   "rows": rows}, open(os.path.join(OUT, "results.json"), "w"), indent=1)
        for name in CANDS:
            summary(rows, name)
        log(f"bench took {time.time() - t0:.0f}s")
    for name, ok in oks.items():
        log(f"{name}: ALL CHECKS PASS" if ok else f"{name}: SOME CHECKS FAILED")
