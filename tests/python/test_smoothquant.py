"""Tests of qpool_export.smoothquant (SmoothQuant calibration of w8a8 layers) and of
`qpool_export --quantize w8a8 --smoothquant ALPHA`.

Run: .venv/bin/python -m pytest tests/python/test_smoothquant.py
"""

import copy
import os
import re
import sys
import warnings

import pytest
import torch
from torch import nn

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "qpool_export"))
from qpool_export import export, quant, smoothquant  # noqa: E402

torch.set_num_threads(1)


def outlier_net(gen):
    """Two linear layers whose first input has a few channels 50x larger than the rest."""
    net = nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 32))
    with torch.no_grad():
        for layer in (net[0], net[2]):
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen) * 0.05)
    return net


def outlier_input(gen, rows=32):
    x = torch.randn(rows, 64, generator=gen)
    x[:, :3] *= 50
    return x


def test_scales_are_the_smoothquant_formula():
    gen = torch.Generator().manual_seed(51)
    net = outlier_net(gen)
    batches = [(outlier_input(gen),) for _ in range(3)]
    maxima = smoothquant.activation_maxima(net, batches)
    assert set(maxima) == {"0", "2"} and maxima["0"].shape == (64,)
    assert torch.equal(maxima["0"], torch.stack([b[0].abs().amax(0) for b in batches]).amax(0))
    scales = smoothquant.smoothing_scales(net, maxima, 0.5)
    w = net[0].weight.abs().amax(0)
    assert torch.allclose(scales["0"], maxima["0"].sqrt() / w.sqrt())
    assert scales["2"].shape == (96,) and bool((scales["2"] > 0).all())
    with pytest.raises(ValueError, match="alpha"):
        smoothquant.smoothing_scales(net, maxima, 0.0)


def test_calibrated_w8a8_is_closer_to_the_float_net():
    """Only the first layer's input has outlier channels; both layers are calibrated."""
    gen = torch.Generator().manual_seed(52)
    net = outlier_net(gen)
    x = outlier_input(gen, 40)
    with torch.no_grad():
        ref = net(x)
    errors = {}
    for calibrated in (False, True):
        q = copy.deepcopy(net)  # the same weights and biases
        smooth = smoothquant.calibrate(q, [(outlier_input(gen),) for _ in range(4)]) \
            if calibrated else None
        assert quant.quantize_module(q, "w8a8", smooth=smooth) == 2
        with torch.no_grad():
            errors[calibrated] = (q(x) - ref).abs().mean().item()
    # Measured: mean |error| 0.0105 calibrated (alpha 0.5), 0.0204 with scales of ones.
    assert errors[True] < 0.6 * errors[False], errors


def run_export(out, *args):
    return export.main(["--preset", "tiny", "--out", str(out), "-q", *args])


def test_export_writes_calibrated_scales(tmp_path):
    out = tmp_path / "tiny-w8a8-sq"
    assert run_export(out, "--quantize", "w8a8", "--smoothquant", "0.5") == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        unet = torch.jit.load(str(out / "unet.pt"))
    buffers = dict(unet.named_buffers())
    codes = [buffers[n[:-len("weight")] + "code"] for n, b in buffers.items()
             if b.dtype == torch.int8]
    assert codes and all(c.dtype == torch.float32 and bool((c > 0).all()) for c in codes)
    assert any(not torch.equal(c, torch.ones_like(c)) for c in codes)
    with torch.no_grad():
        noise = unet(torch.randn(2, 4, 8, 8), torch.tensor([999.0, 1.0]), torch.randn(2, 77, 32))
    assert torch.isfinite(noise).all()


@pytest.mark.parametrize("args,message", [
    (["--smoothquant", "0.5"], "w8a8"),
    (["--quantize", "int8", "--smoothquant", "0.5"], "w8a8"),
    (["--quantize", "w8a8", "--quant-mode", "load-time", "--smoothquant", "0.5"], "prequantized"),
    (["--quantize", "w8a8", "--smoothquant", "1.5"], r"\(0, 1\]"),
])
def test_bad_smoothquant_arguments(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        export.main(["--preset", "tiny", "--out", "x", *args])
    assert exc.value.code != 0
    assert re.search(message, capsys.readouterr().err)
