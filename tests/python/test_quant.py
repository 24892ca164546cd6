"""Tests of qpool_export.quant (the Python reference of qpool's quantized linear layers).

Run: .venv/bin/python -m pytest tests/python/test_quant.py

`python tests/python/test_quant.py --write-golden DIR` writes traced QuantLinear modules with
reference inputs and outputs; the C++ test unit_quant_op_test (PythonReference.*) runs it and
checks that the C++ op and the C++ load-time quantizer reproduce them (outputs and packed bytes).
"""

import copy
import os
import sys
import warnings

import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "qpool_export"))
from qpool_export import quant  # noqa: E402

try:
    import pytest
    parametrize = pytest.mark.parametrize
except ImportError:  # --write-golden needs torch only (e.g. on a GPU host without pytest)
    pytest = None

    def parametrize(*args, **kwargs):
        return lambda f: f

NF4_TABLE = [-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
             -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
             0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
             0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0]

# name, format, blocksize, double_quant, out, in, bias, x dtype, x's leading shape, w8a8 with
# calibrated activation scales (no load-time twin then: the server quantizes with ones)
GOLDEN_CASES = [
    ("int8", "int8", 64, False, 24, 40, True, torch.float32, (3, 2), False),
    ("nf4_oddk", "nf4", 64, False, 24, 100, True, torch.float32, (3, 2), False),
    ("nf4_dq", "nf4", 64, True, 40, 512, False, torch.float32, (3, 2), False),
    ("nf4_bs16_dq_bf16", "nf4", 16, True, 12, 24, True, torch.bfloat16, (3, 2), False),
    ("none", "none", 64, False, 16, 20, True, torch.float32, (3, 2), False),
    # w8a8: int8 product (M >= 17, K and N multiples of 8), in bfloat16, the weight-only
    # fallback (M = 6, K = 36), and calibrated activation scales.
    ("w8a8", "w8a8", 64, False, 24, 40, True, torch.float32, (4, 6), False),
    ("w8a8_bf16", "w8a8", 64, False, 32, 64, False, torch.bfloat16, (2, 17), False),
    ("w8a8_fallback", "w8a8", 64, False, 24, 36, True, torch.float32, (3, 2), False),
    ("w8a8_smooth", "w8a8", 64, False, 16, 48, True, torch.float32, (5, 4), True),
]


def heavy_tailed(n, k, gen):
    chi2 = torch.randn(n, k, generator=gen).pow(2) + torch.randn(n, k, generator=gen).pow(2)
    return torch.randn(n, k, generator=gen) / (chi2 / 2).sqrt().clamp_min(1e-3)


def largest_gap():
    return max(b - a for a, b in zip(NF4_TABLE, NF4_TABLE[1:]))


def nf4_block_error_ok(w, state, blocksize, extra=0.0):
    n, k = w.shape
    kp = (k + blocksize - 1) // blocksize * blocksize
    err = torch.nn.functional.pad((quant.dequantize(state) - w).abs(), (0, kp - k))
    absmax = torch.nn.functional.pad(w.abs(), (0, kp - k)).reshape(-1, blocksize).amax(1)
    bound = absmax * largest_gap() / 2 + 1e-6 + extra
    return bool((err.reshape(-1, blocksize).amax(1) <= bound).all())


def test_schema_constant_is_the_registered_schema():
    assert str(torch.ops.qpool.quant_linear.default._schema) == "qpool::" + quant.SCHEMA


def test_nf4_code_is_the_standard_table():
    code = quant.nf4_code()
    assert code.dtype == torch.float32 and code.tolist() == torch.tensor(NF4_TABLE).tolist()
    nested = quant.nested_code()
    assert nested.shape == (256,) and nested[128] == 0 and nested[255] == 1 and nested[1] == -1


@parametrize("kind", ["normal", "heavy"])
def test_int8_round_trip_within_half_step(kind):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(64, 320, generator=gen) if kind == "normal" else heavy_tailed(48, 200, gen)
    s = quant.quantize_int8(w)
    assert s["weight"].dtype == torch.int8 and s["absmax"].shape == (w.shape[0],)
    err = (quant.dequantize(s) - w).abs().amax(1)
    assert bool((err <= s["absmax"] / 127 / 2 * (1 + 1e-5) + 1e-7).all())
    assert torch.equal(quant.dequantize(s), s["weight"].float() * (s["absmax"] / 127)[:, None])


@parametrize("blocksize", [16, 64, 256])
@parametrize("kind", ["normal", "heavy"])
def test_nf4_round_trip_within_half_largest_gap(blocksize, kind):
    gen = torch.Generator().manual_seed(2)
    w = torch.randn(32, 512, generator=gen) if kind == "normal" else heavy_tailed(16, 768, gen)
    s = quant.quantize_nf4(w, blocksize)
    assert s["weight"].shape == (w.shape[0], w.shape[1] // 2)
    assert s["absmax"].numel() == w.numel() // blocksize
    assert nf4_block_error_ok(w, s, blocksize)


def test_nf4_packing_order_even_element_high_nibble():
    w = quant.nf4_code().reshape(1, 16) * 2
    s = quant.quantize_nf4(w, 16)
    assert s["weight"][0].tolist() == [0x01, 0x23, 0x45, 0x67, 0x89, 0xAB, 0xCD, 0xEF]
    assert torch.equal(quant.dequantize(s), w)
    assert quant.quantize_nf4(w.flip(1), 16)["weight"][0, 0].item() == 0xFE


@parametrize("n,k,bs", [(1, 16, 16), (3, 17, 64), (3, 1, 64), (2, 65, 16)])
def test_nf4_odd_shapes_are_padded_per_row(n, k, bs):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(3))
    s = quant.quantize_nf4(w, bs, double_quant=True)
    kp = (k + bs - 1) // bs * bs
    assert s["weight"].shape == (n, kp // 2) and s["absmax"].numel() == n * kp // bs
    assert quant.dequantize(s).shape == (n, k)
    assert nf4_block_error_ok(w, s, bs, s["nested_absmax"].max().item() / 127 / 2 * 1.01)


def test_double_quant_absmax_round_trip():
    w = heavy_tailed(40, 640, torch.Generator().manual_seed(4))
    plain, dq = quant.quantize_nf4(w, 64), quant.quantize_nf4(w, 64, double_quant=True)
    assert dq["absmax"].dtype == torch.uint8 and dq["absmax"].numel() == 400
    assert dq["nested_absmax"].numel() == 2 and dq["offset"].numel() == 1
    assert torch.equal(dq["weight"], plain["weight"])
    restored = quant.nf4_block_absmax(dq["absmax"], dq["nested_absmax"], dq["nested_code"],
                                      dq["offset"])
    nested = dq["nested_absmax"].repeat_interleave(256)[:400]
    assert bool(((restored - plain["absmax"]).abs() <= nested / 254 * 1.0001 + 1e-6).all())


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown quantization format 'fp8'"):
        quant.quantize(torch.randn(4, 4), "fp8")
    for bs in (0, 8, 48, 8192, 64.0, True):
        with pytest.raises(ValueError, match="power of two"):
            quant.quantize_nf4(torch.randn(4, 64), bs)
    with pytest.raises(ValueError, match="2-D"):
        quant.quantize_int8(torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="floating"):
        quant.quantize_int8(torch.ones(4, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="no nn.Linear layers"):
        quant.quantize_module(nn.Sequential(nn.Conv2d(3, 3, 1)), "int8")
    with pytest.raises(ValueError, match=r"\(1 skipped\)"):
        quant.quantize_module(nn.Sequential(nn.Linear(4, 4)), "nf4", skip=["0"])
    with pytest.raises(ValueError, match="power of two"):
        quant.quantize_module(nn.Sequential(nn.Linear(4, 4)), "nf4", blocksize=24)
    with pytest.raises(ValueError, match="unknown quantization format"):
        quant.quantize_module(nn.Sequential(nn.Linear(4, 4)), "int4")


def test_device_mismatch_and_dtype_errors_name_the_tensor():
    layer = quant.QuantLinear.from_linear(nn.Linear(32, 8), "nf4", 16)
    layer.code = layer.code.to("meta")
    with pytest.raises(RuntimeError, match="code is on meta but x is on cpu"):
        layer(torch.randn(2, 32))
    layer = quant.QuantLinear.from_linear(nn.Linear(32, 8), "int8")
    with pytest.raises(RuntimeError, match="x must be float32"):
        layer(torch.ones(2, 32, dtype=torch.int64))


@parametrize("fmt,bs,dq", [("int8", 64, False), ("nf4", 64, False), ("nf4", 32, True),
                           ("w8a8", 64, False)])
def test_quantize_module_replaces_linears_and_traces_without_constants(fmt, bs, dq):
    torch.manual_seed(5)
    net = nn.Sequential(nn.Linear(40, 48), nn.GELU(), nn.Linear(48, 16, bias=False))
    net.add_module("head", nn.Sequential(nn.Linear(16, 8)))
    x = torch.randn(3, 40)
    ref = net(x)
    assert quant.quantize_module(net, fmt, bs, dq, skip=["head"]) == 2
    assert isinstance(net.head[0], nn.Linear) and isinstance(net[0], quant.QuantLinear)
    assert net[0].format == fmt
    names = {n for n, _ in net.named_buffers()}
    assert {"0.weight", "0.absmax", "0.code", "0.nested_absmax", "0.nested_code", "0.offset",
            "0.bias"} <= names
    with torch.no_grad():
        y = net(x)
    tolerance = {"int8": 0.02, "w8a8": 0.03}.get(fmt, 0.3)
    assert (y - ref).abs().mean() < tolerance * ref.abs().mean()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(net, x)
    assert torch.equal(traced(x), y)
    constants = [n for n in traced.inlined_graph.nodes()
                 if n.kind() == "prim::Constant" and n.output().type().kind() == "TensorType"]
    assert not constants


def test_min_weights_keeps_small_layers_float():
    # Note [Small layers stay float]: 40 x 48 = 1920 weights, 48 x 16 = 768, 16 x 8 = 128.
    net = nn.Sequential(nn.Linear(40, 48), nn.GELU(), nn.Linear(48, 16), nn.Linear(16, 8))
    assert quant.quantize_module(net, "w8a8", min_weights=768) == 2
    assert [type(m).__name__ for m in net] == ["QuantLinear", "GELU", "QuantLinear", "Linear"]
    assert quant.quantize_module(nn.Sequential(nn.Linear(16, 8)), "int8", min_weights=128) == 1
    # Every layer small: the module stays float, which is no error (a component such as SDXL's
    # CLIP-L under a threshold meant for its UNet); `skip` leaving nothing still is one.
    tiny = nn.Sequential(nn.Linear(16, 8))
    assert quant.quantize_module(tiny, "int8", min_weights=129) == 0
    assert type(tiny[0]) is nn.Linear
    with pytest.raises(ValueError, match=r"\(1 skipped\)"):
        quant.quantize_module(nn.Sequential(nn.Linear(16, 8)), "int8", skip=["0"], min_weights=129)


def test_prequantize_false_keeps_float_weights_for_load_time():
    net = nn.Sequential(nn.Linear(8, 8))
    w = net[0].weight.detach().clone()
    assert quant.quantize_module(net, "nf4", prequantize=False) == 1
    assert net[0].format == "none" and torch.equal(net[0].weight, w)
    assert all(getattr(net[0], n).numel() == 0 for n in quant.STATE_NAMES)


def test_meta_and_reference_op_shapes():
    layer = quant.QuantLinear.from_linear(nn.Linear(24, 6), "nf4", 16, True)
    x = torch.randn(2, 3, 24)
    assert layer(x).shape == (2, 3, 6)
    assert layer(x.to(torch.bfloat16)).dtype == torch.bfloat16
    meta = copy.deepcopy(layer).to("meta")
    assert meta(x.to("meta")).shape == (2, 3, 6)


# ---- w8a8 (Note [W8A8 linear] in server/quant/w8a8_linear.h) ----

def w8a8_error_bound(x, state):
    """Per-element bound of |w8a8 output - float output| for x [M, K] (in float32): quantizing a
    row of xs = x / s moves each value by at most a_r / 254 and the weight (of w * s) by at most
    absmax_n / 254, so |err| <= a_r / 254 * sum|w_hat * s| + absmax_n / 254 * sum|xs|, plus
    float32 rounding (1e-5 of sum |xs| |w * s|)."""
    xs = x.float().div(state["code"])
    ws = state["weight"].float().mul(state["absmax"].div(127).unsqueeze(1))
    a = xs.abs().amax(1, keepdim=True)
    return (a / 254 * ws.abs().sum(1) + state["absmax"] / 254 * xs.abs().sum(1, keepdim=True)
            + 1e-5 * xs.abs().matmul(ws.abs().t()) + 1e-6)


def test_w8a8_weight_is_int8_of_the_smoothed_weight():
    gen = torch.Generator().manual_seed(21)
    w = heavy_tailed(24, 64, gen) * 0.1
    plain, int8 = quant.quantize_w8a8(w), quant.quantize_int8(w)
    assert plain["weight"].dtype == torch.int8 and plain["format"] == "w8a8"
    assert torch.equal(plain["weight"], int8["weight"])
    assert torch.equal(plain["absmax"], int8["absmax"])
    assert torch.equal(plain["code"], torch.ones(64))
    s = torch.rand(64, generator=gen) + 0.5
    smoothed = quant.quantize_w8a8(w, s)
    assert torch.equal(smoothed["weight"], quant.quantize_int8(w * s)["weight"])
    assert torch.equal(smoothed["code"], s)
    err = (quant.dequantize(smoothed) - w).abs().mul(s)  # error of w * s, per row
    assert bool((err.amax(1) <= smoothed["absmax"] / 254 * (1 + 1e-5) + 1e-7).all())


@parametrize("m,k,n", [(17, 64, 24), (40, 256, 64), (128, 32, 8)])
def test_w8a8_int_product_is_within_the_quantization_bound(m, k, n):
    gen = torch.Generator().manual_seed(22)
    w = torch.randn(n, k, generator=gen) * 0.05
    x = torch.randn(m, k, generator=gen) * 3
    x[:, 3] *= 20  # an outlier channel
    s = torch.rand(k, generator=gen) + 0.5
    state = quant.quantize_w8a8(w, s)
    assert quant.w8a8_int_matmul_runs(m, k, n)
    y = quant.w8a8_linear(x, state["weight"], state["absmax"], state["code"])
    ref = torch.nn.functional.linear(x, w)
    assert bool(((y - ref).abs() <= w8a8_error_bound(x, state)).all())
    # The integer product is exact: the same values from a float64 product of the int8 values.
    xs = x.div(s)
    amax = xs.abs().amax(1)
    acc = quant.rows_to_int8(xs, amax).double().matmul(state["weight"].double().t())
    exact = acc.float().mul(amax.div(127).unsqueeze(1)).mul(state["absmax"].div(127))
    assert torch.equal(y, exact)


def test_w8a8_error_on_gaussian_data():
    """Measured: mean |error| 1.0% of mean |y| for w8a8, 0.7% for int8 (K = 256)."""
    gen = torch.Generator().manual_seed(23)
    w = torch.randn(64, 256, generator=gen) * 0.05
    x = torch.randn(64, 256, generator=gen)
    ref = torch.nn.functional.linear(x, w)
    errors = {}
    for fmt in ("int8", "w8a8"):
        layer = quant.QuantLinear.from_linear(_linear(w), fmt)
        errors[fmt] = ((layer(x) - ref).abs().mean() / ref.abs().mean()).item()
    assert errors["w8a8"] < 0.015 and errors["int8"] < errors["w8a8"], errors


def _linear(w, bias=None):
    linear = nn.Linear(w.shape[1], w.shape[0], bias=bias is not None)
    with torch.no_grad():
        linear.weight.copy_(w)
        if bias is not None:
            linear.bias.copy_(bias)
    return linear


@parametrize("lead,k", [((2, 8), 64), ((40,), 36), ((3, 1), 64)])
def test_w8a8_falls_back_to_weight_only_int8(lead, k):
    """Fewer than 17 rows, or K or N no multiple of 8: the int8 op on x / s, in x's dtype."""
    gen = torch.Generator().manual_seed(24)
    w, bias = torch.randn(16, k, generator=gen), torch.randn(16, generator=gen)
    x = torch.randn(*lead, k, generator=gen)
    rows = x.numel() // k
    assert not quant.w8a8_int_matmul_runs(rows, k, 16)
    w8a8 = quant.QuantLinear.from_linear(_linear(w, bias), "w8a8")
    int8 = quant.QuantLinear.from_linear(_linear(w, bias), "int8")
    assert torch.equal(w8a8(x), int8(x))
    for dtype in (torch.bfloat16, torch.float16):
        assert torch.equal(w8a8(x.to(dtype)), int8(x.to(dtype)))
    s = torch.rand(k, generator=gen) + 0.5
    smoothed = quant.QuantLinear.from_linear(_linear(w, bias), "w8a8", smooth=s)
    e = torch.empty(0)
    expected = quant._quant_linear_ref(x.div(s), smoothed.weight, smoothed.absmax, e, e, e, e,
                                       bias)
    assert torch.equal(smoothed(x), expected)


def test_w8a8_zero_rows_give_the_bias_and_dtypes_follow_x():
    gen = torch.Generator().manual_seed(25)
    bias = torch.randn(16, generator=gen)
    layer = quant.QuantLinear.from_linear(_linear(torch.randn(16, 32, generator=gen), bias),
                                          "w8a8")
    x = torch.randn(20, 32, generator=gen)
    x[5] = 0
    y = layer(x)
    assert torch.equal(y[5], bias)
    assert torch.isfinite(y).all()
    yb = layer(x.to(torch.bfloat16))
    assert yb.dtype == torch.bfloat16 and yb.shape == (20, 16)
    assert (yb.float() - y).abs().max() < 0.05 * y.abs().max()


def test_w8a8_smoothing_helps_outlier_channels():
    """SmoothQuant's point: with a few large activation channels, s = max|x|^0.5 / max|w|^0.5
    per channel moves the range into the weight and cuts the error."""
    gen = torch.Generator().manual_seed(26)
    w = torch.randn(64, 128, generator=gen) * 0.05
    x = torch.randn(64, 128, generator=gen)
    x[:, :4] *= 50
    ref = torch.nn.functional.linear(x, w)
    s = x.abs().amax(0).sqrt() / w.abs().amax(0).sqrt()
    plain = quant.QuantLinear.from_linear(_linear(w), "w8a8")(x)
    smoothed = quant.QuantLinear.from_linear(_linear(w), "w8a8", smooth=s)(x)
    assert (smoothed - ref).abs().mean() < 0.5 * (plain - ref).abs().mean()


def test_w8a8_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match=r"must be \[8\]"):
        quant.quantize_w8a8(torch.randn(4, 8), torch.ones(7))
    with pytest.raises(ValueError, match="positive and finite"):
        quant.quantize_w8a8(torch.randn(4, 8), torch.tensor([1.0] * 7 + [0.0]))
    layer = quant.QuantLinear.from_linear(nn.Linear(8, 4), "w8a8")
    layer.code = torch.ones(6)
    with pytest.raises(RuntimeError, match=r"w8a8 code \(activation scales\) must be"):
        layer(torch.randn(20, 8))
    with pytest.raises(ValueError, match="prequantized w8a8 only"):
        quant.quantize_module(nn.Sequential(nn.Linear(4, 4)), "int8", smooth={"0": torch.ones(4)})


def test_geglu_schema_constant_is_the_registered_schema():
    assert str(torch.ops.qpool.geglu_quant_linear.default._schema) == \
        "qpool::" + quant.GEGLU_QUANT_LINEAR_SCHEMA


def _feed_forwards(seed: int = 3) -> nn.Module:
    from qpool_export import blocks

    torch.manual_seed(seed)
    return nn.Sequential(blocks.FeedForward(16), blocks.FeedForward(16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_geglu_linears_give_the_same_bytes(dtype):
    """Note [GEGLU linear op]: after fuse_geglu_linears the w8a8 feed-forwards run their GEGLU
    inside the output linear's op, with the unfused outputs' bytes, in the product's int8 path
    (20 rows) and its fallback (3 rows); the traced graph calls the fused op and no qpool::geglu."""
    module = _feed_forwards().to(dtype)
    quant.quantize_module(module, "w8a8", smooth={"0.net.2": torch.rand(64) + 0.5})
    xs = [torch.randn(2, 10, 16).to(dtype), torch.randn(3, 16).to(dtype)]
    with torch.no_grad():
        want = [module(x) for x in xs]
        assert quant.fuse_geglu_linears(module) == 2
        got = [module(x) for x in xs]
    for w, g in zip(want, got):
        assert torch.equal(w, g)
    assert all(isinstance(ff.net[2], quant.GegluQuantLinear) and ff.net[0].in_linear
               for ff in module)
    assert module[0].net[2].format == "w8a8"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = str(torch.jit.trace(module, xs[0]).inlined_graph)
    assert graph.count("qpool::geglu_quant_linear") == 2 and "qpool::geglu(" not in graph


def test_only_w8a8_feed_forwards_are_fused():
    for fmt in ("int8", "nf4"):
        module = _feed_forwards()
        quant.quantize_module(module, fmt)
        assert quant.fuse_geglu_linears(module) == 0
        assert not any(ff.net[0].in_linear for ff in module)
    float_module = _feed_forwards()
    assert quant.fuse_geglu_linears(float_module) == 0
    module = _feed_forwards()
    quant.quantize_module(module, "w8a8", skip=["1.net.2"])
    assert quant.fuse_geglu_linears(module) == 1
    assert type(module[1].net[2]) is nn.Linear and not module[1].net[0].in_linear


def test_norm_schema_constants_are_the_registered_schemas():
    assert str(torch.ops.qpool.layer_norm_quant_linear.default._schema) == \
        "qpool::" + quant.LAYER_NORM_QUANT_LINEAR_SCHEMA
    assert str(torch.ops.qpool.add_layer_norm_quant_linear.default._schema) == \
        "qpool::" + quant.ADD_LAYER_NORM_QUANT_LINEAR_SCHEMA


def _transformer_block(seed: int = 5) -> nn.Module:
    from qpool_export import blocks

    torch.manual_seed(seed)
    holder = nn.ModuleList([blocks.BasicTransformerBlock(32, 24, 2)])
    blocks.fuse_projections(holder)
    return holder[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_norm_linears_give_the_same_bytes(dtype):
    """Note [Norm linear op]: after fuse_norm_linears a w8a8 transformer block's three norms run
    the linear that reads each of them, with the unfused outputs' bytes, in the product's int8
    path (40 rows) and its fallback (3 rows); the traced graph calls the fused ops and no plain
    layer_norm, and every tensor is read by the module that owns it."""
    block = _transformer_block().to(dtype)
    quant.quantize_module(block, "w8a8", smooth={"attn2.to_q": torch.rand(32) + 0.5})
    inputs = [(torch.randn(2, 20, 32).to(dtype), torch.randn(2, 7, 24).to(dtype)),
              (torch.randn(1, 3, 32).to(dtype), torch.randn(1, 7, 24).to(dtype))]
    with torch.no_grad():
        want = [block(*i) for i in inputs]
        assert quant.fuse_geglu_linears(block) == 1
        assert quant.fuse_norm_linears(block) == 3
        got = [block(*i) for i in inputs]
    for w, g in zip(want, got):
        assert torch.equal(w, g)
    norms = (block.norm1, block.norm2, block.norm3)
    assert all(type(n) is quant.NormQuantLinear for n in norms)
    assert block.norm1.format == "w8a8" and block.norm3.out_features == 256
    assert all(type(m) is nn.Identity for m in (block.attn1.to_qkv, block.attn2.to_q,
                                                block.ff.net[0].proj))
    assert block.norm2.norm_weight.dtype == dtype and not block.norm2.norm_weight.requires_grad
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph = str(torch.jit.trace(block, inputs[0]).inlined_graph)
    assert graph.count("qpool::layer_norm_quant_linear") == 1
    assert graph.count("qpool::add_layer_norm_quant_linear") == 2
    assert "qpool::layer_norm(" not in graph and "qpool::add_layer_norm(" not in graph


def test_only_w8a8_norm_linears_are_fused():
    for fmt in ("int8", "nf4"):
        block = _transformer_block()
        quant.quantize_module(block, fmt)
        assert quant.fuse_norm_linears(block) == 0
    assert quant.fuse_norm_linears(_transformer_block()) == 0
    block = _transformer_block()
    quant.quantize_module(block, "w8a8", skip=["attn1.to_qkv"])
    assert quant.fuse_norm_linears(block) == 2
    assert type(block.attn1.to_qkv) is nn.Linear and type(block.norm1) is not quant.NormQuantLinear


class _Golden(nn.Module):
    """A layer plus the input and output the Python reference computed for it."""

    def __init__(self, layer, x, y):
        super().__init__()
        self.layer = layer
        self.register_buffer("x_ref", x)
        self.register_buffer("y_ref", y)

    def forward(self, x):
        return self.layer(x)


def write_golden(folder: str) -> None:
    """For each case: <name>.pt (pre-quantized, with x_ref / y_ref), <name>_float.pt (float
    weights for load-time quantization; not for calibrated w8a8) and a line of cases.txt: name
    format blocksize dq calibrated."""
    os.makedirs(folder, exist_ok=True)
    gen = torch.Generator().manual_seed(1234)
    lines = []
    for name, fmt, bs, dq, n, k, bias, dtype, lead, calibrated in GOLDEN_CASES:
        linear = nn.Linear(k, n, bias=bias)
        with torch.no_grad():
            linear.weight.copy_(heavy_tailed(n, k, gen) * 0.1)
            if bias:
                linear.bias.copy_(torch.randn(n, generator=gen))
        x = torch.randn(*lead, k, generator=gen).to(dtype)
        smooth = torch.rand(k, generator=gen).mul(3).add(0.25) if calibrated else None
        for suffix, pre in (("", True), ("_float", False))[:1 if calibrated else 2]:
            layer = quant.QuantLinear.from_linear(copy.deepcopy(linear), fmt, bs, dq, pre,
                                                  smooth=smooth)
            with torch.no_grad():
                y = layer(x)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                traced = torch.jit.trace(_Golden(layer, x, y), x)
                torch.jit.save(traced, os.path.join(folder, f"{name}{suffix}.pt"))
        lines.append(f"{name} {fmt} {bs} {int(dq)} {int(calibrated)}\n")
    with open(os.path.join(folder, "cases.txt"), "w") as f:
        f.writelines(lines)


def test_write_golden(tmp_path):
    write_golden(str(tmp_path))
    names = (tmp_path / "cases.txt").read_text().split("\n")
    assert len([n for n in names if n]) == len(GOLDEN_CASES)
    m = torch.jit.load(str(tmp_path / "w8a8_smooth.pt"))
    assert m.layer.weight.dtype == torch.int8
    assert dict(m.layer.named_buffers())["code"].shape == (48,)  # .code is the TorchScript
    assert torch.equal(m(m.x_ref), m.y_ref) and not (tmp_path / "w8a8_smooth_float.pt").exists()
    m = torch.jit.load(str(tmp_path / "nf4_dq.pt"))
    assert torch.equal(m(m.x_ref), m.y_ref)
    assert m.layer.absmax.dtype == torch.uint8


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--write-golden":
        write_golden(sys.argv[2])
    else:
        sys.exit(pytest.main([__file__] + sys.argv[1:]))
