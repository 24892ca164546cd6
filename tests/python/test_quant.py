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

# name, format, blocksize, double_quant, out, in, bias, x dtype
GOLDEN_CASES = [
    ("int8", "int8", 64, False, 24, 40, True, torch.float32),
    ("nf4_oddk", "nf4", 64, False, 24, 100, True, torch.float32),
    ("nf4_dq", "nf4", 64, True, 40, 512, False, torch.float32),
    ("nf4_bs16_dq_bf16", "nf4", 16, True, 12, 24, True, torch.bfloat16),
    ("none", "none", 64, False, 16, 20, True, torch.float32),
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


@parametrize("fmt,bs,dq", [("int8", 64, False), ("nf4", 64, False), ("nf4", 32, True)])
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
    tolerance = 0.02 if fmt == "int8" else 0.3
    assert (y - ref).abs().mean() < tolerance * ref.abs().mean()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(net, x)
    assert torch.equal(traced(x), y)
    constants = [n for n in traced.inlined_graph.nodes()
                 if n.kind() == "prim::Constant" and n.output().type().kind() == "TensorType"]
    assert not constants


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
    weights for load-time quantization) and a line of cases.txt: name format blocksize dq."""
    os.makedirs(folder, exist_ok=True)
    gen = torch.Generator().manual_seed(1234)
    lines = []
    for name, fmt, bs, dq, n, k, bias, dtype in GOLDEN_CASES:
        linear = nn.Linear(k, n, bias=bias)
        with torch.no_grad():
            linear.weight.copy_(heavy_tailed(n, k, gen) * 0.1)
            if bias:
                linear.bias.copy_(torch.randn(n, generator=gen))
        x = torch.randn(3, 2, k, generator=gen).to(dtype)
        for suffix, pre in (("", True), ("_float", False)):
            layer = quant.QuantLinear.from_linear(copy.deepcopy(linear), fmt, bs, dq, pre)
            with torch.no_grad():
                y = layer(x)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                traced = torch.jit.trace(_Golden(layer, x, y), x)
                torch.jit.save(traced, os.path.join(folder, f"{name}{suffix}.pt"))
        lines.append(f"{name} {fmt} {bs} {int(dq)}\n")
    with open(os.path.join(folder, "cases.txt"), "w") as f:
        f.writelines(lines)


def test_write_golden(tmp_path):
    write_golden(str(tmp_path))
    names = (tmp_path / "cases.txt").read_text().split("\n")
    assert len([n for n in names if n]) == len(GOLDEN_CASES)
    m = torch.jit.load(str(tmp_path / "nf4_dq.pt"))
    assert torch.equal(m(m.x_ref), m.y_ref)
    assert m.layer.absmax.dtype == torch.uint8


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--write-golden":
        write_golden(sys.argv[2])
    else:
        sys.exit(pytest.main([__file__] + sys.argv[1:]))
