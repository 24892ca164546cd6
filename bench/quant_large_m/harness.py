# Correctness and timing of the sm_90a large-M quant_linear kernel (libqk_large.so, see build.sh)
# against a float32 reference, fp16/bf16 F.linear and dequantize + F.linear (the path it replaces),
# on the benchmark layers of bench/quant_linear_bench.cpp. Writes log.txt and results.json to $OUT
# (or /tmp/out). Usage: python3 harness.py [check|bench|all] [M,M,...] (default 77,154,256,512,1024,4096);
# python3 harness.py splitcost measures one stream-K split;
# python3 harness.py report results.json prints the markdown tables of bench/results.
import json, os, sys, time
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "quant_small_m"))
from qk_common import DEV, OUT, SHAPES, ErrorTally, Weight, log, time_fn  # noqa: E402
from qk_large import Library  # noqa: E402

MODE = sys.argv[1] if len(sys.argv) > 1 else "all"
MS = tuple(int(v) for v in sys.argv[2].split(",")) if len(sys.argv) > 2 and MODE != "report" else (77, 154, 256, 512, 1024, 4096)
BNS = (256, 128, 64)  # rows of x per output tile
if MODE != "report":
    LIB = Library()
    PROPS = torch.cuda.get_device_properties(0)


def tile_name(bn):
    return f"wg{bn}"


def run_wgmma(w, x, bias, out, bn, sms=None, schedule=0):
    LIB.wgmma(w, x, bias, out, bn, sms, schedule)


def run_dequant_linear(w, x, bias, wbuf):
    LIB.dequant(w, wbuf)
    return F.linear(x, wbuf, bias)


def check():
    g = torch.Generator(device=DEV)
    g.manual_seed(4321)
    # (264, 8192): bands of x shorter than x (Note [Tile raster]) at M = 2049
    shapes = [(320, 320), (200, 768), (8, 64), (1280, 640), (136, 2048), (3072, 128), (264, 1280),
              (264, 8192)]
    fmts = [("int8", 64, False), ("nf4", 64, False), ("nf4", 64, True), ("nf4", 128, True),
            ("nf4", 256, False), ("nf4", 1024, True)]
    ms = [1, 7, 64, 100, 128, 129, 255, 256, 300, 513, 1024, 2049]  # 2049: several tiles per block
    tally = ErrorTally(shown=40)
    for (n, k) in shapes:
        for fmt, bs, dq in fmts:
            if fmt == "nf4" and k % bs:
                continue
            w = Weight(n, k, fmt, bs, dq, g)
            for m in ms:
                for dt in (torch.float16, torch.bfloat16):
                    x = torch.randn(m, k, device=DEV, generator=g).to(dt)
                    bias = torch.randn(n, device=DEV, generator=g).to(dt) if m % 2 else None
                    out = torch.empty(m, n, device=DEV, dtype=dt)
                    sup = LIB.supported(w, x, m)
                    if sup != 1:
                        log(f"UNSUPPORTED {fmt} bs{bs} {n}x{k} -> {sup}")
                        return False
                    ref = x.float() @ w.ref.t()
                    if bias is not None:
                        ref = ref + bias.float()
                    # every tile, data-parallel and stream-K on the whole GPU and on 7 blocks
                    for bn, sms, sched in [(bn, sms, sc) for bn in BNS for sms in (None, 7) for sc in (1, 2)]:
                        out.fill_(float("nan"))
                        run_wgmma(w, x, bias, out, bn, sms, sched)
                        torch.cuda.synchronize()
                        tally.add(f"{fmt}{'dq' if dq else ''}_{str(dt)[6:]}_{tile_name(bn)}", out, ref,
                                  f"{fmt} bs{bs} dq{dq} {n}x{k} M={m} {dt} {tile_name(bn)} sms={sms} schedule={sched}")
    return tally.report("")


def bench(ms=MS):
    g = torch.Generator(device=DEV)
    g.manual_seed(7)
    rows = []
    layers = os.environ.get("LAYERS")  # comma-separated names of SHAPES to keep (default: all)
    for name, k, n in SHAPES:
        if layers and name not in layers.split(","):
            continue
        wf = torch.randn(n, k, device=DEV, generator=g).half() * 0.05
        variants = {key: Weight(n, k, fmt, 64, dq, g, ref=False)
                    for key, fmt, dq in (("int8", "int8", False), ("nf4", "nf4", False), ("nf4dq", "nf4", True))}
        wbuf = torch.empty(n, k, device=DEV, dtype=torch.float16)
        for m in ms:
            x = torch.randn(m, k, device=DEV, generator=g).half()
            out = torch.empty(m, n, device=DEV, dtype=torch.float16)
            rec = {"shape": name, "K": k, "N": n, "M": m}
            rec["fp16"] = time_fn([lambda: F.linear(x, wf)])
            for key, w in variants.items():
                rec[f"{key}_dequant"] = time_fn([lambda w=w: run_dequant_linear(w, x, None, wbuf)])
                for bn in BNS:
                    rec[f"{key}_{tile_name(bn)}"] = time_fn([lambda w=w, bn=bn: run_wgmma(w, x, None, out, bn)])
                    for sc, tag in ((1, "dp"), (2, "sk")):
                        rec[f"{key}_{tile_name(bn)}{tag}"] = time_fn([lambda w=w, bn=bn, sc=sc: run_wgmma(w, x, None, out, bn, None, sc)])
            f = rec["fp16"]
            rows.append(rec)
            log(f"{name:28s} M={m:5d} fp16 {f:7.1f}us tflops {2*m*n*k/f/1e6:6.0f} | " + " | ".join(
                f"{v} dq {rec[f'{v}_dequant']/f:.2f} " + " ".join(f"{tile_name(bn)} {rec[f'{v}_{tile_name(bn)}']/f:.2f}" for bn in BNS)
                for v in variants))
        del variants
        torch.cuda.empty_cache()
    return rows


def split_cost():
    """The cost of one stream-K split (Note [Stream-K schedule]): the same tiles of K values split
    in halves between two blocks each (stream-K on twice as many blocks as tiles) against tiles of
    K / 2 values, one block each (data-parallel): equal work per block, one split more."""
    g = torch.Generator(device=DEV)
    g.manual_seed(1)
    for fmt in ("int8", "nf4"):
        for n, k, m, bn in ((3072, 3072, 256, 256), (3072, 3072, 512, 256), (1280, 2560, 1024, 256),
                            (3072, 3072, 256, 128)):
            tiles = (n // 128) * ((m + bn - 1) // bn)
            w_full, w_half = Weight(n, k, fmt, 64, False, g, ref=False), Weight(n, k // 2, fmt, 64, False, g, ref=False)
            x_full = torch.randn(m, k, device=DEV, generator=g).half()
            x_half = torch.randn(m, k // 2, device=DEV, generator=g).half()
            out = torch.empty(m, n, device=DEV, dtype=torch.float16)
            split = time_fn([lambda: run_wgmma(w_full, x_full, None, out, bn, 2 * tiles, 2)])
            half = time_fn([lambda: run_wgmma(w_half, x_half, None, out, bn, tiles, 1)])
            whole = time_fn([lambda: run_wgmma(w_full, x_full, None, out, bn, tiles, 1)])
            log(f"split cost {fmt} {n}x{k} M={m} {tile_name(bn)} {tiles} tiles: {split - half:.1f} us "
                f"(split {split:.1f} us, half depth unsplit {half:.1f} us, whole {whole:.1f} us, "
                f"k-block {(whole - half) / (k // 128):.3f} us)")


def report(path):
    """Markdown tables of a results.json: each variant's time over fp16, dequantize + F.linear first."""
    d = json.load(open(path))
    tiles = [k[len("nf4_"):] for k in d["rows"][0] if k.startswith("nf4_wg")]
    auto = [t for t in tiles if t[-2:] not in ("dp", "sk")]
    print(f"Device: {d['device']}, torch {d['torch']}, CUDA {d['cuda']}. Time / fp16 F.linear time, "
          "measured side by side; `dequant` = dequantize + F.linear, `wgB` = the warpgroup-MMA kernel "
          "with output tiles of 128 features x B rows of x and its automatic schedule, `dp` / `sk` the "
          "same tile forced data-parallel / stream-K; the last column compares the best automatic "
          "tile with the dequantize path.\n")
    for v in ("int8", "nf4", "nf4dq"):
        print(f"### {v}\n\n| layer (K x N) | M | fp16 us | dequant | " + " | ".join(tiles) + " | best wg / dequant |")
        print("| --- | --- | --- | --- | " + " | ".join("---" for _ in tiles) + " | --- |")
        for r in d["rows"]:
            f = r["fp16"]
            best = min(r[f"{v}_{t}"] for t in auto)
            print(f"| {r['shape']} | {r['M']} | {f:.1f} | {r[f'{v}_dequant']/f:.2f} | " +
                  " | ".join(f"{r[f'{v}_{t}']/f:.2f}" for t in tiles) + f" | {best / r[f'{v}_dequant']:.2f} |")
        print()


if __name__ == "__main__" and MODE == "report":
    report(sys.argv[2])
    sys.exit(0)

if __name__ == "__main__":
    log(f"device {PROPS.name} sms {PROPS.multi_processor_count} torch {torch.__version__} cuda {torch.version.cuda}")
    if MODE == "splitcost":
        split_cost()
        sys.exit(0)
    ok = check() if MODE in ("all", "check") else True
    if MODE in ("all", "bench") and ok:
        t0 = time.time()
        rows = bench()
        json.dump({"device": PROPS.name, "torch": torch.__version__, "cuda": torch.version.cuda, "M": MS,
                   "rows": rows}, open(os.path.join(OUT, "results.json"), "w"), indent=1)
        log(f"bench took {time.time() - t0:.0f}s")
    log("ALL CHECKS PASS" if ok else "SOME CHECKS FAILED")
