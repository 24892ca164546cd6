"""qpool_export.layer_error: each quantized layer's own error against the float layer it
replaced, on the inputs that layer saw in the float module."""

import copy

import pytest
import torch
from torch import nn

from qpool_export import layer_error, quant


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(64, 128)
        self.second = nn.Linear(128, 32, bias=False)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


def batches():
    gen = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 24, 64, generator=gen),), (torch.randn(2, 64, generator=gen),)]


@pytest.mark.parametrize("fmt, bound", [("int8", 0.02), ("w8a8", 0.03), ("nf4", 0.15)])
def test_errors_are_each_layers_own_and_within_the_formats_bounds(fmt, bound):
    torch.manual_seed(0)
    module = TwoLayers()
    float_copy = copy.deepcopy(module)
    records = layer_error.capture(module, batches())
    assert set(records) == {"first", "second"}
    assert [tuple(x.shape) for x, _ in records["second"]] == [(4, 24, 128), (2, 128)]
    quant.quantize_module(module, fmt)
    errors = layer_error.errors(module, records)
    assert set(errors) == {"first", "second"}
    for name, e in errors.items():
        assert e["format"] == fmt
        assert 0 < e["relative_error"] < bound, (name, e)
        assert e["cosine"] > 1 - bound ** 2, (name, e)
    # The second layer's error is its own: measured on the float first layer's outputs, over
    # both batches, recomputed here by hand.
    diff = ref = 0.0
    with torch.no_grad():
        for (x,) in batches():
            h = torch.relu(float_copy.first(x))
            want = float_copy.second(h).double()
            diff += ((module.second(h).double() - want) ** 2).sum().item()
            ref += (want ** 2).sum().item()
    assert errors["second"]["relative_error"] == pytest.approx((diff / ref) ** 0.5, rel=1e-6)


def test_layers_left_in_float_are_not_reported_and_worst_orders_by_error():
    torch.manual_seed(0)
    module = TwoLayers()
    records = layer_error.capture(module, batches())
    quant.quantize_module(module, "nf4", skip=["second"])
    errors = layer_error.errors(module, records)
    assert list(errors) == ["first"]
    made_up = {"a": {"relative_error": 0.1}, "b": {"relative_error": 0.3},
               "c": {"relative_error": 0.2}}
    assert layer_error.worst(made_up, 2) == ["b", "c"]
