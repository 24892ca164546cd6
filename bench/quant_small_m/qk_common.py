# Shared by harness.py (small and medium M) and ../quant_large_m/harness.py: random packed
# weights with their float32 reference, the benchmark layers and the CUDA-event timer.
import ctypes, math, os, statistics
import torch

DEV = torch.device("cuda")


NF4 = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
       -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
       0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
       0.7229568362236023, 1.0]


class View(ctypes.Structure):
    _fields_ = [("weight", ctypes.c_void_p), ("nf4", ctypes.c_bool), ("double_quant", ctypes.c_bool),
                ("rows", ctypes.c_int64), ("in_features", ctypes.c_int64), ("padded_in", ctypes.c_int64),
                ("row_bytes", ctypes.c_int64), ("blocksize", ctypes.c_int64), ("block_shift", ctypes.c_int),
                ("absmax", ctypes.c_void_p), ("absmax_q", ctypes.c_void_p), ("code", ctypes.c_void_p),
                ("nested_absmax", ctypes.c_void_p), ("nested_code", ctypes.c_void_p), ("offset", ctypes.c_void_p)]


class Weight:
    """A random packed weight (int8 / nf4 / nf4+dq) on the GPU with its float32 dequantized form."""

    def __init__(self, n, k, fmt, bs=64, dq=False, g=None, ref=True):
        self.n, self.k, self.fmt, self.bs, self.dq = n, k, fmt, bs, dq
        v = View()
        v.rows, v.in_features = n, k
        self.keep = []
        if fmt == "int8":
            q = torch.randint(-127, 128, (n, k), dtype=torch.int8, device=DEV, generator=g)
            am = torch.rand(n, device=DEV, generator=g) * 0.2 + 0.01
            self.keep += [q, am]
            v.weight, v.nf4, v.padded_in, v.row_bytes = q.data_ptr(), False, k, k
            v.absmax = am.data_ptr()
            self.ref = q.float() * (am / 127.0)[:, None] if ref else None
        else:
            kp = (k + bs - 1) // bs * bs
            wb = torch.randint(0, 256, (n, kp // 2), dtype=torch.uint8, device=DEV, generator=g)
            nb = n * kp // bs
            code = torch.tensor(NF4, device=DEV)
            v.weight, v.nf4, v.padded_in, v.row_bytes, v.blocksize = wb.data_ptr(), True, kp, kp // 2, bs
            v.block_shift = int(math.log2(bs))
            v.code = code.data_ptr()
            self.keep += [wb, code]
            if dq:
                aq = torch.randint(0, 256, (nb,), dtype=torch.uint8, device=DEV, generator=g)
                nested_code = (torch.arange(256, device=DEV, dtype=torch.float32) - 128) / 127
                nested_absmax = torch.rand((nb + 255) // 256, device=DEV, generator=g) * 0.05 + 0.01
                offset = torch.tensor([0.06], device=DEV)
                am = (nested_code[aq.long()] * nested_absmax[torch.arange(nb, device=DEV) // 256]) + offset
                self.keep += [aq, nested_code, nested_absmax, offset]
                v.double_quant = True
                v.absmax_q, v.nested_absmax = aq.data_ptr(), nested_absmax.data_ptr()
                v.nested_code, v.offset = nested_code.data_ptr(), offset.data_ptr()
            else:
                am = torch.rand(nb, device=DEV, generator=g) * 0.1 + 0.01
                self.keep.append(am)
                v.absmax = am.data_ptr()
            self.ref = None
            if ref:
                idx = torch.stack([wb >> 4, wb & 15], dim=-1).reshape(n, kp).long()
                vals = code[idx]
                flat = vals.reshape(-1) * am.repeat_interleave(bs)
                self.ref = flat.reshape(n, kp)[:, :k].contiguous()
        self.view = v
        self.vp = ctypes.byref(v)
        self.nbytes = sum(t.numel() * t.element_size() for t in self.keep)


SHAPES = [("sd15_attn_320x320", 320, 320), ("sd15_geglu_320x2560", 320, 2560),
          ("sd15_ff_1280x5120", 1280, 5120), ("sd15_xattn_kv_768x320", 768, 320),
          ("sdxl_attn_640x640", 640, 640), ("sdxl_ff_1280x10240", 1280, 10240),
          ("sdxl_xattn_kv_2048x1280", 2048, 1280), ("flux_attn_3072x3072", 3072, 3072),
          ("flux_mlp_up_3072x12288", 3072, 12288), ("flux_mlp_down_12288x3072", 12288, 3072)]


# $OUT (or /tmp/out): where the harnesses write log.txt and their JSON.
OUT = os.environ.get("OUT", "/tmp/out")
os.makedirs(OUT, exist_ok=True)
_LOG = None


def log(*a):
    """Prints a line and appends it to $OUT/log.txt."""
    global _LOG
    if _LOG is None:
        _LOG = open(os.path.join(OUT, "log.txt"), "a")
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    _LOG.write(s + "\n")
    _LOG.flush()


def relative_error(out, ref):
    """max |out - ref| / max |ref| (inf where out holds a NaN or inf) and whether out is finite."""
    finite = bool(torch.isfinite(out).all())
    scale = ref.abs().max().item() + 1e-6
    return ((out.float() - ref).abs().max().item() / scale if finite else float("inf")), finite


class ErrorTally:
    """The checks' bookkeeping: every case against its float32 reference at the tolerance of x's
    dtype (fp16 4e-3, bf16 2e-2), the worst relative error per key, and the first failures logged."""

    def __init__(self, shown):
        self.worst, self.total, self.fails, self.shown = {}, 0, 0, shown

    def add(self, key, out, ref, what):
        """Records `out` (filled with NaN before the kernel wrote it) against `ref`; its error."""
        err, finite = relative_error(out, ref)
        self.worst[key] = max(self.worst.get(key, 0.0), err)
        self.total += 1
        if not err <= (4e-3 if out.dtype == torch.float16 else 2e-2):
            self.fails += 1
            if self.fails < self.shown:
                log(f"FAIL {what} err={err:.3g} finite={finite}")
        return err

    def report(self, label, extra=""):
        """Logs the worst errors and the count; whether every case passed."""
        for key, err in sorted(self.worst.items()):
            log(f"worst rel err {key}: {err:.2e}")
        log(f"CHECK{label}: {self.total - self.fails}/{self.total} cases pass{extra}")
        return self.fails == 0


def layer_inputs(layer, fmt, m):
    """A benchmark layer for a profiler: (packed weight, fp16 weight, x, out), seeded."""
    k, n = next((k, n) for name, k, n in SHAPES if name == layer)
    g = torch.Generator(device=DEV)
    g.manual_seed(7)
    w = Weight(n, k, "int8" if fmt == "int8" else "nf4", 64, fmt == "nf4dq", g, ref=False)
    wf = torch.randn(n, k, device=DEV, generator=g).half() * 0.05
    x = torch.randn(m, k, device=DEV, generator=g).half()
    return w, wf, x, torch.empty(m, n, device=DEV, dtype=torch.float16)


def time_fn(fns, calls=20, samples=15):
    """Median us per call; fns is a list cycled through (several weight copies for cold runs)."""
    for i in range(3):
        fns[i % len(fns)]()
    torch.cuda.synchronize()
    res = []
    idx = 0
    for _ in range(samples):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_500_000)
        s.record()
        for _ in range(calls):
            fns[idx % len(fns)]()
            idx += 1
        e.record()
        e.synchronize()
        res.append(s.elapsed_time(e) * 1000 / calls)
    return statistics.median(res)


