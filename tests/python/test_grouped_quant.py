"""Tests of qpool_export.grouped_quant (the Python reference of qpool::grouped_quant_linear and
GroupedQuantLinear, a mixture's routed experts as one quantized layer; Note [Grouped linear op]).

Run: .venv/bin/python -m pytest tests/python/test_grouped_quant.py
"""

import os
import sys

import pytest
import torch
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "qpool_export"))
from qpool_export import grouped_quant, quant  # noqa: E402


def test_grouped_schema_constant_is_the_registered_schema():
    assert str(torch.ops.qpool.grouped_quant_linear.default._schema) == \
        "qpool::" + grouped_quant.GROUPED_QUANT_LINEAR_SCHEMA


@pytest.mark.parametrize("fmt, double_quant", [("none", False), ("int8", False), ("nf4", False),
                                               ("nf4", True), ("w8a8", False)])
def test_grouped_linear_is_each_groups_dequantized_product(fmt, double_quant):
    """Note [Grouped linear op]: each group's rows times its own weight, the stacked layer
    quantized as one (nf4 blocks and double quant across the groups' boundary included); a
    group with no row gives none, the others are unaffected."""
    torch.manual_seed(11)
    groups, n, k = 3, 24, 32
    weights = [torch.randn(n, k) for _ in range(groups)]
    layer = grouped_quant.GroupedQuantLinear.stacked(weights)
    quant.quantize_module(nn.ModuleDict({"g": layer}), fmt, double_quant=double_quant)
    assert layer.format == fmt
    w = quant.dequantize_tensors(layer.weight, layer.absmax, layer.code, layer.nested_absmax,
                                 layer.nested_code, layer.offset, k).view(groups, n, k)
    for ends in ([5, 5, 12], [0, 7, 12], [12, 12, 12]):
        x = torch.randn(12, k)
        got = layer(x, torch.tensor(ends, dtype=torch.int32))
        assert got.shape == (12, n)
        start = 0
        for g, end in enumerate(ends):
            want = x[start:end] @ w[g].t()
            assert torch.allclose(got[start:end], want, rtol=1e-5, atol=1e-5), (ends, g)
            start = end


def test_grouped_linear_bad_input_is_a_clear_error():
    layer = grouped_quant.GroupedQuantLinear.stacked([torch.randn(8, 16), torch.randn(8, 16)])
    x, offs = torch.randn(4, 16), torch.tensor([2, 4], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="offs must be int32"):
        layer(x, offs.long())
    with pytest.raises(RuntimeError, match="for 3 groups"):
        layer(x, torch.tensor([1, 2, 4], dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"x must be a float32, float16 or bfloat16 \[rows"):
        layer(x[None], offs)
    with pytest.raises(RuntimeError, match="offs is on meta"):
        layer(x, offs.to("meta"))
