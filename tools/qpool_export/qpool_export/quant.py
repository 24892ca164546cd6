"""Quantized linear layers for qpool components: int8 (per-row absmax), w8a8 (int8 weights and
per-token int8 activations) and NF4 (block-wise, optional double quantization), the Python
reference of the ``qpool::quant_linear`` op and ``QuantLinear``, the module the exporter puts in
place of ``nn.Linear``.

Layouts (docs/quantization.md; C++: server/quant/quant_format.h, Note [Quantized weight layouts]):

* none: weight float [N, K]; the five state tensors are empty (numel 0, float32).
* int8: weight int8 [N, K], absmax float32 [N]; w = q * (absmax / 127).
* w8a8: int8's weight and absmax, quantized from w * s (column-wise), and code float32 [K] = s,
  the activation scales (ones without calibration); w = q * (absmax / 127) / s. The op divides x
  by s, quantizes each row of it to int8 and multiplies in int32 (w8a8_linear(); C++: Note
  [W8A8 linear] in server/quant/w8a8_linear.h).
* nf4:  rows zero-padded to Kp = roundup(K, blocksize); weight uint8 [N, Kp / 2] with element 2j in
  the high nibble and 2j+1 in the low nibble (bitsandbytes order); absmax float32 [N * Kp /
  blocksize]; code float32 [16] (NF4_CODE); w = code[nibble] * absmax[block].
* nf4 + double quant: absmax uint8 [nblocks], offset float32 [] (mean of the float absmax),
  nested_absmax float32 [ceil(nblocks / 256)], nested_code float32 [256] = (i - 128) / 127;
  absmax_f = nested_code[absmax] * nested_absmax[b // 256] + offset.

Every function here uses exactly the tensor operations of server/quant/quantizer.cpp, so the
server's load-time quantization produces the same bytes as a pre-quantized export.
"""

from typing import Dict, Iterable, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

# blocks registers qpool::geglu, which a UNet file calls: a loader of qpool's files imports quant.
from . import blocks  # noqa: F401
from . import ops

# Byte-identical to kQuantLinearSchema in server/quant/quant_linear_op.h; keep it on one line:
# unit_quant_op_test reads it from this file and compares.
SCHEMA = "quant_linear(Tensor x, Tensor weight, Tensor absmax, Tensor code, Tensor nested_absmax, Tensor nested_code, Tensor offset, Tensor? bias) -> Tensor"  # noqa: E501

FORMATS = ("none", "int8", "nf4", "w8a8")
STATE_NAMES = ("absmax", "code", "nested_absmax", "nested_code", "offset")
# Buffers kept in float32 whatever --dtype says, as the server keeps them (KeepsSavedDtype in
# server/component/component.h): the sinusoidal frequency tables of timestep and size embeddings.
FLOAT32_BUFFERS = ("freqs",)
NESTED_BLOCKSIZE = 256
# w8a8 multiplies in int8 (torch._int_mm) for at least W8A8_MIN_ROWS rows and K, N multiples of
# W8A8_MULTIPLE (CUDA's limits, applied on every device), else falls back to weight-only int8.
W8A8_MIN_ROWS, W8A8_MULTIPLE = 17, 8
MIN_BLOCKSIZE, MAX_BLOCKSIZE = 16, 4096

# The 16 NormalFloat-4 values of the QLoRA paper, as bitsandbytes publishes them.
NF4_CODE = (
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
)

State = Dict[str, object]


def nf4_code(device=None) -> torch.Tensor:
    """NF4_CODE as float32 [16]."""
    return torch.tensor(NF4_CODE, dtype=torch.float32, device=device)


def nested_code(device=None) -> torch.Tensor:
    """The 8-bit code of double quantization, float32 [256]: (i - 128) / 127."""
    return torch.arange(256, dtype=torch.float32, device=device).sub(128).div(127)


def _empty(device) -> torch.Tensor:
    return torch.empty(0, dtype=torch.float32, device=device)


def nearest_code_index(x: torch.Tensor, code: torch.Tensor) -> torch.Tensor:
    """Index (int64) of the nearest value of the ascending `code` for each element of float32 x;
    a value exactly between two codes maps to the lower one."""
    mid = code[:-1].add(code[1:]).div(2)
    return torch.bucketize(x, mid)


def check_blocksize(blocksize) -> None:
    if (not isinstance(blocksize, int) or isinstance(blocksize, bool) or blocksize <= 0
            or blocksize & (blocksize - 1) or not MIN_BLOCKSIZE <= blocksize <= MAX_BLOCKSIZE):
        raise ValueError(f"nf4 blocksize must be a power of two in [{MIN_BLOCKSIZE}, "
                         f"{MAX_BLOCKSIZE}], got {blocksize!r}")


def _check_weight(w: torch.Tensor, name: str) -> None:
    if not isinstance(w, torch.Tensor) or w.dim() != 2:
        dims = w.dim() if isinstance(w, torch.Tensor) else type(w).__name__
        raise ValueError(f"{name}: weight must be 2-D [out, in] to quantize, got {dims}-D")
    if not w.is_floating_point():
        raise ValueError(f"{name}: only floating weights can be quantized, got {w.dtype}")
    if w.numel() == 0:
        raise ValueError(f"{name}: weight is empty")


def _safe(absmax: torch.Tensor) -> torch.Tensor:
    return torch.where(absmax == 0, torch.ones_like(absmax), absmax)


def rows_to_int8(x: torch.Tensor, absmax: torch.Tensor) -> torch.Tensor:
    """clamp(round_half_even(x / absmax * 127), -127, 127) as int8 for the rows of float32 x
    (a row with absmax 0 is divided by 1: zeros). Weights and w8a8 activations alike."""
    return x.div(_safe(absmax).unsqueeze(1)).mul(127).round().clamp(-127, 127).to(torch.int8)


@torch.no_grad()
def quantize_int8(w: torch.Tensor, name: str = "weight") -> State:
    """Symmetric per-row int8: {'weight': int8 [N, K], 'absmax': float32 [N], ...}."""
    _check_weight(w, name)
    d = w.device
    w = w.detach().to(torch.float32)
    absmax = w.abs().amax(1)
    return {"format": "int8", "shape": tuple(w.shape), "weight": rows_to_int8(w, absmax),
            "absmax": absmax, "code": _empty(d), "nested_absmax": _empty(d),
            "nested_code": _empty(d), "offset": _empty(d)}


@torch.no_grad()
def quantize_w8a8(w: torch.Tensor, smooth: Optional[torch.Tensor] = None,
                  name: str = "weight") -> State:
    """int8 of w * smooth (column-wise) with smooth, the activation scales, as 'code' (ones when
    None: then weight and absmax are quantize_int8's bytes)."""
    _check_weight(w, name)
    d = w.device
    k = w.shape[1]
    wf = w.detach().to(torch.float32)
    if smooth is None:
        s = torch.ones(k, dtype=torch.float32, device=d)
    else:
        s = smooth.detach().to(device=d, dtype=torch.float32).contiguous()
        if s.dim() != 1 or s.numel() != k:
            raise ValueError(f"{name}: w8a8 activation scales must be [{k}] (one per input "
                             f"feature), got {tuple(s.shape)}")
        if not bool((s.gt(0) & s.isfinite()).all()):
            raise ValueError(f"{name}: w8a8 activation scales must be positive and finite")
        wf = wf.mul(s)
    absmax = wf.abs().amax(1)
    return {"format": "w8a8", "shape": (w.shape[0], k), "weight": rows_to_int8(wf, absmax),
            "absmax": absmax, "code": s, "nested_absmax": _empty(d), "nested_code": _empty(d),
            "offset": _empty(d)}


@torch.no_grad()
def quantize_nf4(w: torch.Tensor, blocksize: int = 64, double_quant: bool = False,
                 name: str = "weight") -> State:
    """Block-wise NF4 (rows zero-padded to a multiple of blocksize), optionally with the absmax
    double-quantized to 8 bits."""
    _check_weight(w, name)
    try:
        check_blocksize(blocksize)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    d = w.device
    n, k = w.shape
    kp = (k + blocksize - 1) // blocksize * blocksize
    code = nf4_code(d)
    wf = w.detach().to(torch.float32)
    if kp != k:
        wf = F.pad(wf, (0, kp - k))
    blocks = wf.reshape(-1, blocksize)
    absmax = blocks.abs().amax(1)
    idx = nearest_code_index(blocks.div(_safe(absmax).unsqueeze(1)), code)
    idx = idx.to(torch.uint8).reshape(n, kp // 2, 2)
    packed = idx[..., 0].bitwise_left_shift(4).bitwise_or(idx[..., 1])
    state = {"format": "nf4", "shape": (n, k), "weight": packed, "absmax": absmax, "code": code,
             "nested_absmax": _empty(d), "nested_code": _empty(d), "offset": _empty(d)}
    if double_quant:
        nblocks = absmax.numel()
        nested = (nblocks + NESTED_BLOCKSIZE - 1) // NESTED_BLOCKSIZE
        offset = absmax.mean()
        centered = F.pad(absmax.sub(offset), (0, nested * NESTED_BLOCKSIZE - nblocks))
        centered = centered.reshape(nested, NESTED_BLOCKSIZE)
        nested_absmax = centered.abs().amax(1)
        ncode = nested_code(d)
        q = nearest_code_index(centered.div(_safe(nested_absmax).unsqueeze(1)), ncode)
        state.update(absmax=q.to(torch.uint8).reshape(-1)[:nblocks].contiguous(),
                     nested_absmax=nested_absmax, nested_code=ncode, offset=offset)
    return state


def quantize(w: torch.Tensor, fmt: str, blocksize: int = 64, double_quant: bool = False,
             name: str = "weight", smooth: Optional[torch.Tensor] = None) -> State:
    """Dispatches on fmt ('none' keeps the weight, with empty state; smooth: w8a8's activation
    scales, ones when None)."""
    if fmt == "int8":
        return quantize_int8(w, name)
    if fmt == "nf4":
        return quantize_nf4(w, blocksize, double_quant, name)
    if fmt == "w8a8":
        return quantize_w8a8(w, smooth, name)
    if fmt != "none":
        raise ValueError(f"unknown quantization format {fmt!r} (expected one of {FORMATS})")
    _check_weight(w, name)
    d = w.device
    return {"format": "none", "shape": tuple(w.shape), "weight": w.detach(),
            **{s: _empty(d) for s in STATE_NAMES}}


def _layout(weight, absmax, code, in_features: int) -> Tuple[str, int, int]:
    """(format, padded_in, blocksize) derived from the tensors, as the C++ op does."""
    if weight.is_floating_point():
        return "none", weight.shape[1], 0
    if weight.dtype == torch.int8:
        return ("w8a8" if code.numel() > 0 else "int8"), weight.shape[1], 0
    if weight.dtype != torch.uint8:
        raise RuntimeError(f"qpool::quant_linear: weight dtype {weight.dtype} is not a known "
                           f"format")
    kp = 2 * weight.shape[1]
    blocksize = weight.shape[0] * kp // max(absmax.numel(), 1)
    if not (kp - blocksize < in_features <= kp):
        raise RuntimeError(f"qpool::quant_linear: nf4 weight rows hold {kp} values (blocksize "
                           f"{blocksize}) but the input has {in_features} features")
    return "nf4", kp, blocksize


def nf4_block_absmax(absmax, nested_absmax, nested_code_t, offset) -> torch.Tensor:
    """Float32 absmax per block (undoes double quantization)."""
    if absmax.dtype == torch.float32:
        return absmax
    n = absmax.numel()
    nested = nested_absmax.repeat_interleave(NESTED_BLOCKSIZE)[:n]
    return nested_code_t[absmax.long()].mul(nested).add(offset.reshape(()))


def dequantize_tensors(weight, absmax, code, nested_absmax, nested_code_t, offset,
                       in_features: int, dtype=torch.float32) -> torch.Tensor:
    """The [N, in_features] weight the tensors stand for, computed in float32 then cast."""
    fmt, kp, blocksize = _layout(weight, absmax, code, in_features)
    if fmt == "none":
        return weight.to(dtype)
    if fmt == "int8":
        w = weight.to(torch.float32).mul(absmax.div(127).unsqueeze(1))
    elif fmt == "w8a8":
        w = weight.to(torch.float32).mul(absmax.div(127).unsqueeze(1)).div(code)
    else:
        b = weight.contiguous()
        idx = torch.stack([b.bitwise_right_shift(4), b.bitwise_and(15)], 2)
        values = code[idx.reshape(-1).long()]
        scale = nf4_block_absmax(absmax, nested_absmax, nested_code_t, offset).unsqueeze(1)
        w = values.reshape(-1, blocksize).mul(scale).reshape(weight.shape[0], kp)
        w = w[:, :in_features]
    return w.to(dtype).contiguous()


def dequantize(state: State, dtype=torch.float32) -> torch.Tensor:
    """Inverse of quantize*(): the float weight of `state` (shape state['shape'])."""
    k = state["shape"][1] if "shape" in state else None
    if k is None:
        k = state["weight"].shape[1] * (2 if state["weight"].dtype == torch.uint8 else 1)
    return dequantize_tensors(state["weight"], state["absmax"], state["code"],
                              state["nested_absmax"], state["nested_code"], state["offset"], k,
                              dtype)


def _check_devices(x, weight, absmax, code, nested_absmax, nested_code_t, offset, bias):
    named = (("weight", weight), ("absmax", absmax), ("code", code),
             ("nested_absmax", nested_absmax), ("nested_code", nested_code_t), ("offset", offset),
             ("bias", bias))
    for name, t in named:
        if t is not None and t.device != x.device:
            raise RuntimeError(f"qpool::quant_linear: {name} is on {t.device} but x is on "
                               f"{x.device}; every tensor of a quantized linear layer must be "
                               f"on x's device")


def w8a8_int_matmul_runs(rows: int, in_features: int, out_features: int) -> bool:
    """Whether w8a8 multiplies in int8 for this many rows of x (else weight-only int8)."""
    return (rows >= W8A8_MIN_ROWS and in_features > 0 and in_features % W8A8_MULTIPLE == 0
            and out_features > 0 and out_features % W8A8_MULTIPLE == 0)


def w8a8_linear(x, weight, absmax, smooth, bias=None) -> torch.Tensor:
    """The w8a8 product (C++: W8A8Linear, Note [W8A8 linear]): x / smooth quantized per row to
    int8, times the int8 weight in int32, scaled by (row absmax / 127) * (absmax / 127), plus
    bias, in float32, cast to x's dtype; weight-only int8 of x / smooth where
    w8a8_int_matmul_runs() says no."""
    k, n = x.shape[-1], weight.shape[0]
    x2 = x.reshape(-1, k)
    xs = x2.to(torch.float32).div(smooth)
    if not w8a8_int_matmul_runs(x2.shape[0], k, n):
        e = _empty(x.device)
        y = _quant_linear_ref(xs.to(x.dtype), weight, absmax, e, e, e, e, bias)
        return y.reshape(*x.shape[:-1], n)
    amax = xs.abs().amax(1)
    acc = torch._int_mm(rows_to_int8(xs, amax), weight.contiguous().t())
    y = acc.to(torch.float32).mul(amax.div(127).unsqueeze(1)).mul(absmax.div(127))
    if bias is not None:
        y = y.add(bias.to(torch.float32))
    return y.to(x.dtype).reshape(*x.shape[:-1], n)


def _quant_linear_ref(x, weight, absmax, code, nested_absmax, nested_code_t, offset, bias):
    """Python reference of qpool::quant_linear: dequantize in float32, linear, cast (w8a8:
    w8a8_linear())."""
    _check_devices(x, weight, absmax, code, nested_absmax, nested_code_t, offset, bias)
    if x.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise RuntimeError(f"qpool::quant_linear: x must be float32, float16 or bfloat16, "
                           f"got {x.dtype}")
    from .weights_file import is_placeholder

    if is_placeholder(weight):
        # A streamed graph's placeholder (Note [Streaming import] in stream_import.py), zeros:
        # the product is the bias, without dequantizing a weight of the layer's size.
        y = x.new_zeros(tuple(x.shape[:-1]) + (weight.shape[0],), dtype=torch.float32)
        return (y if bias is None else y.add(bias.to(torch.float32))).to(x.dtype)
    if weight.dtype == torch.int8 and code.numel() > 0:
        if code.dtype != torch.float32 or code.shape != (x.shape[-1],):
            raise RuntimeError(f"qpool::quant_linear: w8a8 code (activation scales) must be "
                               f"float32 [{x.shape[-1]}], got {code.dtype} {tuple(code.shape)}")
        return w8a8_linear(x, weight, absmax, code, bias)
    w = dequantize_tensors(weight, absmax, code, nested_absmax, nested_code_t, offset,
                           x.shape[-1])
    b = bias.to(torch.float32) if bias is not None else None
    return F.linear(x.to(torch.float32), w, b).to(x.dtype)


def _quant_linear_fake(x, weight, absmax, code, nested_absmax, nested_code_t, offset, bias):
    _check_devices(x, weight, absmax, code, nested_absmax, nested_code_t, offset, bias)
    return x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],))


_LIB = ops.register(SCHEMA, _quant_linear_ref, _quant_linear_fake)


class QuantLinear(nn.Module):
    """y = x W^T + b through torch.ops.qpool.quant_linear. Every tensor is a buffer (weight, the
    five state tensors, bias), so tracing reads them with GetAttr and the server's mover and
    accountant see them all; the format is implied by the buffers' dtypes."""

    def __init__(self, in_features: int, out_features: int, state: State,
                 bias: Optional[torch.Tensor] = None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.register_buffer("weight", state["weight"])
        for name in STATE_NAMES:
            self.register_buffer(name, state[name])
        self.register_buffer("bias", None if bias is None else bias.detach())

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: str, blocksize: int = 64,
                    double_quant: bool = False, prequantize: bool = True,
                    name: str = "weight", smooth: Optional[torch.Tensor] = None) -> "QuantLinear":
        """A QuantLinear with linear's weights, quantized now (prequantize) or kept in float
        (format none, for the server to quantize at load time); smooth: w8a8's activation
        scales (ones when None)."""
        state = quantize(linear.weight, fmt if prequantize else "none", blocksize, double_quant,
                         name, smooth)
        return cls(linear.in_features, linear.out_features, state, linear.bias)

    @property
    def format(self) -> str:
        return _layout(self.weight, self.absmax, self.code, self.in_features)[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.qpool.quant_linear(x, self.weight, self.absmax, self.code,
                                            self.nested_absmax, self.nested_code, self.offset,
                                            self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"format={self.format}, bias={self.bias is not None}")


# Byte-identical to kGegluQuantLinearSchema in server/quant/geglu_linear_op.h; one line, as SCHEMA.
GEGLU_QUANT_LINEAR_SCHEMA = "geglu_quant_linear(Tensor x, Tensor weight, Tensor absmax, Tensor code, Tensor nested_absmax, Tensor nested_code, Tensor offset, Tensor? bias) -> Tensor"  # noqa: E501


def _geglu_quant_linear_ref(x, weight, absmax, code, nested_absmax, nested_code_t, offset, bias):
    """qpool::geglu_quant_linear's reference: qpool::geglu's, then qpool::quant_linear's."""
    return _quant_linear_ref(blocks.geglu_ref(x), weight, absmax, code, nested_absmax,
                             nested_code_t, offset, bias)


def _geglu_quant_linear_fake(x, weight, absmax, code, nested_absmax, nested_code_t, offset,
                             bias):
    _check_devices(x, weight, absmax, code, nested_absmax, nested_code_t, offset, bias)
    return x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],))


_GEGLU_LIB = ops.register(GEGLU_QUANT_LINEAR_SCHEMA, _geglu_quant_linear_ref,
                          _geglu_quant_linear_fake)


class GegluQuantLinear(QuantLinear):
    """A feed-forward's output linear that takes the GEGLU's input (the projection's output,
    [..., 2 * in_features]) through torch.ops.qpool.geglu_quant_linear: the GEGLU and the linear
    in one op, whose w8a8 form quantizes the GEGLU's rows as it computes them (Note [GEGLU linear
    op] in server/quant/geglu_linear_op.h). Its tensors are QuantLinear's, read by its own
    forward, so streaming brings them in with it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.qpool.geglu_quant_linear(x, self.weight, self.absmax, self.code,
                                                  self.nested_absmax, self.nested_code,
                                                  self.offset, self.bias)


def fuse_geglu_linears(module: nn.Module) -> int:
    """Moves the GEGLU of every feed-forward of `module` whose output linear is a w8a8
    QuantLinear into that linear (a GegluQuantLinear; the GEGLU module then returns its
    projection's output). The outputs are the same bytes. Run it after quantization and the
    layer errors: a fused linear takes the projection's output, not the layer's input. Returns
    the number of feed-forwards fused."""
    count = 0
    for ff in module.modules():
        if not isinstance(ff, blocks.FeedForward):
            continue
        out = ff.net[2]
        if type(out) is not QuantLinear or out.format != "w8a8":
            continue
        state = {"weight": out.weight, **{name: getattr(out, name) for name in STATE_NAMES}}
        ff.net[2] = GegluQuantLinear(out.in_features, out.out_features, state, out.bias)
        ff.net[0].in_linear = True
        count += 1
    return count


# Byte-identical to kLayerNormQuantLinearSchema and kAddLayerNormQuantLinearSchema in
# server/quant/norm_linear_op.h; one line each, as SCHEMA.
LAYER_NORM_QUANT_LINEAR_SCHEMA = "layer_norm_quant_linear(Tensor x, Tensor norm_weight, Tensor norm_bias, float eps, Tensor weight, Tensor absmax, Tensor code, Tensor nested_absmax, Tensor nested_code, Tensor offset, Tensor? bias) -> Tensor"  # noqa: E501
ADD_LAYER_NORM_QUANT_LINEAR_SCHEMA = "add_layer_norm_quant_linear(Tensor x, Tensor residual, Tensor norm_weight, Tensor norm_bias, float eps, Tensor weight, Tensor absmax, Tensor code, Tensor nested_absmax, Tensor nested_code, Tensor offset, Tensor? bias) -> (Tensor, Tensor)"  # noqa: E501


def _layer_norm_quant_linear_ref(x, norm_weight, norm_bias, eps, *state):
    """qpool::layer_norm_quant_linear's reference: qpool::layer_norm's, then qpool::quant_linear's
    (state: weight, the five state tensors, bias)."""
    return _quant_linear_ref(blocks.layer_norm_ref(x, norm_weight, norm_bias, eps), *state)


def _layer_norm_quant_linear_fake(x, norm_weight, norm_bias, eps, weight, *state):
    _check_devices(x, weight, *state)
    return x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],))


def _add_layer_norm_quant_linear_ref(x, residual, norm_weight, norm_bias, eps, *state):
    """qpool::add_layer_norm_quant_linear's reference: qpool::add_layer_norm's, then
    qpool::quant_linear's on the normed rows."""
    total, normed = blocks.add_layer_norm_ref(x, residual, norm_weight, norm_bias, eps)
    return total, _quant_linear_ref(normed, *state)


def _add_layer_norm_quant_linear_fake(x, residual, norm_weight, norm_bias, eps, weight, *state):
    _check_devices(x, weight, *state)
    return x.new_empty(x.shape), x.new_empty(tuple(x.shape[:-1]) + (weight.shape[0],))


_NORM_LIB = ops.register(LAYER_NORM_QUANT_LINEAR_SCHEMA, _layer_norm_quant_linear_ref,
                         _layer_norm_quant_linear_fake)
_ADD_NORM_LIB = ops.register(ADD_LAYER_NORM_QUANT_LINEAR_SCHEMA,
                             _add_layer_norm_quant_linear_ref, _add_layer_norm_quant_linear_fake)


class NormQuantLinear(QuantLinear):
    """A LayerNorm (blocks.FusedLayerNorm, or blocks.ResidualLayerNorm when `residual`) and the
    one linear that reads its output, in one module and one op: forward(x) returns the linear's
    output, forward(x, residual) (x + residual, the linear's output), the norm's forward then the
    linear's with the same bytes. The linear's tensors are QuantLinear's; the norm's weight and
    bias are norm_weight and norm_bias, so the op reads only this module's own tensors and
    streaming brings them in together (Note [Norm linear op] in server/quant/norm_linear_op.h)."""

    def __init__(self, norm: nn.LayerNorm, linear: QuantLinear, residual: bool):
        state = {"weight": linear.weight, **{name: getattr(linear, name) for name in STATE_NAMES}}
        super().__init__(linear.in_features, linear.out_features, state, linear.bias)
        # Parameters, as the norm's were: the server counts them as weights.
        self.norm_weight = nn.Parameter(norm.weight.detach(), requires_grad=False)
        self.norm_bias = nn.Parameter(norm.bias.detach(), requires_grad=False)
        self.eps = float(norm.eps)
        self.residual = residual

    def forward(self, x: torch.Tensor,  # type: ignore[override]
                residual: Optional[torch.Tensor] = None):
        state = (self.weight, self.absmax, self.code, self.nested_absmax, self.nested_code,
                 self.offset, self.bias)
        if self.residual:
            return torch.ops.qpool.add_layer_norm_quant_linear(
                x, residual, self.norm_weight, self.norm_bias, self.eps, *state)
        return torch.ops.qpool.layer_norm_quant_linear(x, self.norm_weight, self.norm_bias,
                                                       self.eps, *state)


def replace_submodule(module: nn.Module, name: str, new: nn.Module) -> None:
    """Puts `new` in place of module's submodule `name` (a qualified name, not empty)."""
    parent, _, attr = name.rpartition(".")
    setattr(module.get_submodule(parent) if parent else module, attr, new)


def fuse_norm_linears(module: nn.Module) -> int:
    """Moves every w8a8 QuantLinear of `module` that reads a UNet block's norm alone (the
    LayerNorm folds that smoothing_folds() lists) into that norm's module, a NormQuantLinear in
    the norm's place; the linear's place holds an nn.Identity. The outputs are the same bytes.
    Run it after quantization and the layer errors, as fuse_geglu_linears. Returns the number of
    norms fused."""
    from . import smoothquant

    count = 0
    for f in smoothquant.folds(module):
        norm, linear = module.get_submodule(f.producer), module.get_submodule(f.consumer)
        residual = type(norm) is blocks.ResidualLayerNorm
        if not (residual or type(norm) is blocks.FusedLayerNorm):
            continue
        if type(linear) is not QuantLinear or linear.format != "w8a8":
            continue
        replace_submodule(module, f.producer, NormQuantLinear(norm, linear, residual))
        replace_submodule(module, f.consumer, nn.Identity())
        count += 1
    return count


def quantize_module(module: nn.Module, fmt: str, blocksize: int = 64, double_quant: bool = False,
                    skip: Iterable[str] = (), prequantize: bool = True,
                    smooth: Optional[Dict[str, torch.Tensor]] = None, min_weights: int = 0,
                    errors: Optional[Dict[str, float]] = None) -> int:
    """Replaces every nn.Linear of `module` whose qualified name contains no `skip` substring by a
    QuantLinear (quantized now if prequantize, else in float for load-time quantization), and
    quantizes every float GroupedQuantLinear (grouped_quant.py) so named now if prequantize (as
    one layer of its stacked weights, which is how the server sees it). With
    prequantize, layers of fewer than `min_weights` weights stay nn.Linear; without, every layer
    stays quantizable and the server applies min_weights at load (Note [Small layers stay
    float]).
    smooth: w8a8 activation scales by qualified layer name (layers it does not name get ones).
    Returns the number of layers replaced: 0 when every layer is below min_weights (the module
    stays float); ValueError for a bad format or blocksize, or when `skip` leaves no layer.
    errors: filled with each quantized layer's weight_error (not for weights on meta)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown quantization format {fmt!r} (expected one of {FORMATS})")
    if fmt == "nf4":
        check_blocksize(blocksize)
    elif double_quant:
        raise ValueError("double_quant applies to nf4 only")
    if smooth and (fmt != "w8a8" or not prequantize):
        raise ValueError("activation scales (smooth) apply to prequantized w8a8 only")
    smooth = smooth or {}
    skip = [s for s in skip if s]
    targets, skipped, small = [], 0, 0
    for qualified, child in module.named_modules():
        if not isinstance(child, nn.Linear):
            continue
        if any(s in qualified for s in skip):
            skipped += 1
        elif prequantize and child.weight.numel() < min_weights:
            small += 1
        else:
            targets.append(qualified)
    # Grouped layers (grouped_quant.GroupedQuantLinear, the QuantLinears with groups; float until
    # now) quantize as one layer of their stacked weights.
    grouped = [(qualified, child) for qualified, child in module.named_modules()
               if isinstance(child, QuantLinear) and hasattr(child, "groups")
               and child.format == "none"
               and not any(s in qualified for s in skip)
               and not (prequantize and child.weight.numel() < min_weights)]
    if not targets and not small and not grouped:
        raise ValueError(f"no nn.Linear layers to quantize in {type(module).__name__}"
                         + (f" ({skipped} skipped)" if skipped else ""))
    for qualified in targets:
        if not qualified:
            raise ValueError("the module itself is an nn.Linear; wrap it in a container")
        linear = module.get_submodule(qualified)
        quantized = QuantLinear.from_linear(linear, fmt, blocksize, double_quant, prequantize,
                                            qualified, smooth.get(qualified))
        if errors is not None and prequantize and linear.weight.device.type != "meta":
            errors[qualified] = weight_error(linear.weight, quantized)
        replace_submodule(module, qualified, quantized)
    for qualified, layer in grouped:
        if not prequantize:
            continue  # stays float; the server quantizes it at load
        weight = layer.weight
        state = quantize(weight, fmt, blocksize, double_quant, qualified)
        for name in ("weight",) + STATE_NAMES:
            setattr(layer, name, state[name])
        if errors is not None and weight.device.type != "meta":
            errors[qualified] = weight_error(weight, layer)
    return len(targets) + len(grouped)


def weight_error(weight: torch.Tensor, layer: "QuantLinear") -> float:
    """The layer's largest weight difference from `weight` (its float weight), relative to the
    largest magnitude of `weight`: the format's error on the layer's own weights."""
    got = dequantize_tensors(layer.weight, layer.absmax, layer.code, layer.nested_absmax,
                             layer.nested_code, layer.offset, layer.in_features)
    want = weight.detach().to(torch.float32)  # (w8a8's dequantization undoes its smoothing)
    scale = want.abs().max().item()
    return (got - want).abs().max().item() / scale if scale else 0.0
