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
from qpool_export import blocks, export, quant, smoothquant, text_encoder  # noqa: E402
from qpool_export import weights_file  # noqa: E402

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


def transformer_block(gen):
    """A UNet transformer block with fused projections and norms that are not the identity, and
    batches of its inputs (tokens, text)."""
    block = blocks.BasicTransformerBlock(64, 48, 4)
    assert blocks.fuse_projections(block) == 2
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.3 if p.dim() == 1 else 0.1))
        for norm in (block.norm1, block.norm2, block.norm3):
            norm.weight.add_(1)
    batches = [(outlier_input(gen, 24).view(2, 12, 64), torch.randn(2, 7, 48, generator=gen))
               for _ in range(3)]
    return block, batches


BLOCK_FOLDS = {"attn1.to_qkv": "norm1", "attn1.to_out.0": "attn1.to_qkv",
               "attn2.to_q": "norm2", "attn2.to_out.0": "attn2.to_kv",
               "ff.net.0.proj": "norm3", "ff.net.2": "ff.net.0.proj"}


def test_folds_name_each_layer_read_from_one_producer():
    block, _ = transformer_block(torch.Generator().manual_seed(53))
    found = {f.consumer: f for f in smoothquant.folds(block)}
    assert {c: f.producer for c, f in found.items()} == BLOCK_FOLDS
    assert found["attn1.to_out.0"].rows == (128, 192) and found["ff.net.2"].rows == (0, 256)
    layer = text_encoder.ClipEncoderLayer(text_encoder.TextEncoderConfig(hidden_size=32, num_heads=4))
    outer = nn.ModuleList([layer])
    assert {(f.consumer, f.producer) for f in smoothquant.folds(outer)} == {
        ("0.self_attn.out_proj", "0.self_attn.v_proj"), ("0.mlp.fc1", "0.layer_norm2")}


def test_folding_keeps_the_outputs_and_leaves_the_other_scales():
    """Note [Folded smoothing]: in float32 the folded block computes what it did, its folded
    layers read x / s, and the scales of the layers that read the text stay to divide by."""
    gen = torch.Generator().manual_seed(54)
    block, batches = transformer_block(gen)
    scales = smoothquant.calibrate(block, batches)
    with torch.no_grad():
        ref = [block(*b) for b in batches]
    before = smoothquant.activation_maxima(block, batches)
    left = smoothquant.fold(block, scales)
    assert set(left) == set(scales) - set(BLOCK_FOLDS) == {"attn2.to_kv"}
    assert torch.equal(left["attn2.to_kv"], scales["attn2.to_kv"])
    with torch.no_grad():
        for b, r in zip(batches, ref):
            torch.testing.assert_close(block(*b), r, rtol=1e-4, atol=1e-5)
    after = smoothquant.activation_maxima(block, batches)
    for name in BLOCK_FOLDS:
        torch.testing.assert_close(after[name], before[name] / scales[name], rtol=1e-4, atol=1e-6)


def test_folded_w8a8_is_as_close_to_the_float_block():
    """The folded layers quantize the same x / s with the same w * s: the w8a8 block's error
    against the float block is the unfolded one's, up to rounding."""
    gen = torch.Generator().manual_seed(55)
    block, batches = transformer_block(gen)
    x = (outlier_input(gen, 24).view(2, 12, 64), torch.randn(2, 7, 48, generator=gen))
    with torch.no_grad():
        ref = block(*x)
    errors = {}
    for folded in (False, True):
        q = copy.deepcopy(block)
        scales = smoothquant.calibrate(q, batches)
        smooth = smoothquant.fold(q, scales) if folded else scales
        assert quant.quantize_module(q, "w8a8", smooth=smooth) == 7
        codes = {n: m.code for n, m in q.named_modules() if isinstance(m, quant.QuantLinear)}
        assert all(torch.equal(codes[n], torch.ones_like(codes[n])) == folded
                   for n in BLOCK_FOLDS)
        with torch.no_grad():
            errors[folded] = (q(*x) - ref).abs().mean().item()
    assert errors[True] == pytest.approx(errors[False], rel=0.05), errors


def test_scales_beyond_the_folded_range_stay():
    gen = torch.Generator().manual_seed(56)
    block, batches = transformer_block(gen)
    scales = smoothquant.calibrate(block, batches)
    scales["ff.net.2"][5] = 2 * smoothquant.MAX_FOLDED
    scales["attn2.to_q"][0] = 0.5 / smoothquant.MAX_FOLDED
    weight = block.ff.net[2].weight.clone()
    left = smoothquant.fold(block, scales)
    assert set(left) == {"attn2.to_kv", "ff.net.2", "attn2.to_q"}
    assert torch.equal(block.ff.net[2].weight, weight)


def run_export(out, *args):
    return export.main(["--preset", "tiny", "--out", str(out), "-q", *args])


def test_export_writes_calibrated_scales(tmp_path):
    out = tmp_path / "tiny-w8a8-sq"
    assert run_export(out, "--quantize", "w8a8", "--smoothquant", "0.5") == 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        unet = weights_file.load_component(str(out / "unet.pt"))
    buffers = dict(unet.named_buffers())
    codes = [buffers[n[:-len("weight")] + "code"] for n, b in buffers.items()
             if b.dtype == torch.int8]
    assert codes and all(c.dtype == torch.float32 and bool((c > 0).all()) for c in codes)
    # Folded into their producers (Note [Folded smoothing]) or left to divide by.
    assert any(torch.equal(c, torch.ones_like(c)) for c in codes)
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
