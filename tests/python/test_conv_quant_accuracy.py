"""bench/conv_quant_accuracy.py: the int8 rounding it applies to convolutions, and that it leaves
the model as it found it."""
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import conv_quant_accuracy as cq  # noqa: E402


def test_each_image_is_rounded_to_127_levels_of_its_own_scale():
    torch.manual_seed(0)
    t = torch.randn(3, 16, 5, 5) * torch.tensor([1.0, 10.0, 0.01]).view(3, 1, 1, 1)
    q = cq.int8_rows(t, (1, 2, 3))
    for n in range(3):
        scale = t[n].abs().max() / 127
        levels = q[n] / scale
        assert torch.allclose(levels, levels.round(), atol=1e-3)
        assert levels.abs().max() <= 127 + 1e-3
        assert (q[n] - t[n]).abs().max() <= scale / 2 * (1 + 1e-5)
    whole = cq.int8_rows(t, (0, 1, 2, 3))  # one scale: the small image loses its values
    assert whole[2].abs().max() < q[2].abs().max()


def test_quantized_convolutions_match_the_int8_formula_and_are_restored():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(4, 16, 3, padding=1),
                              torch.nn.Conv2d(16, 32, 3, padding=1))
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        before = net(x)
        wide = net[1].weight.clone()
        with cq.Quantized(net, "per_image") as q:
            assert q.convs == [net[1]]  # 4 input channels: not a multiple of 16
            during = net(x)
        expected = torch.nn.functional.conv2d(cq.int8_rows(net[0](x), (1, 2, 3)),
                                              cq.int8_rows(wide, (1, 2, 3)), net[1].bias,
                                              padding=1)
        assert torch.allclose(during, expected, atol=1e-6)
        assert not torch.equal(during, before)
        with cq.Quantized(net, "weights"):
            assert not torch.equal(net[1].weight, wide)
        with cq.Quantized(net, "linears") as q:
            assert q.convs == []
        assert torch.equal(net[1].weight, wide) and torch.equal(net(x), before)
        assert not net[1]._forward_hooks


def test_smoothing_balances_input_and_weight_channels_without_changing_the_product():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(16, 16, 3, padding=1)
    x = torch.randn(2, 16, 6, 6) * torch.logspace(-2, 2, 16).view(1, -1, 1, 1)
    s = cq.smoothing(x, conv.weight.detach()).view(1, -1, 1, 1)
    xs, ws = x / s, conv.weight.detach() * s
    assert torch.allclose(xs.abs().amax(dim=(0, 2, 3)), ws.abs().amax(dim=(0, 2, 3)), rtol=1e-4)
    with torch.no_grad():
        ref = conv(x)
        smooth = cq.quantized_conv(conv, x, "smooth")
        plain = cq.quantized_conv(conv, x, "per_batch")
    error = lambda y: ((y - ref).norm() / ref.norm()).item()  # noqa: E731
    assert error(smooth) < error(plain)  # channels of very different ranges: smoothing helps


def test_asymmetric_and_fp8_roundings():
    t = torch.cat([torch.linspace(-0.28, 0, 50), torch.linspace(0, 5, 500)])
    a = cq.uint8_range(t)
    step = (5 + 0.28) / 255
    assert (a - t).abs().max() <= step / 2 + 1e-6  # twice int8's resolution over [-5, 5]
    assert cq.uint8_range(torch.zeros(3)).eq(0).all() and a[49] == 0  # zero stays exact
    f = cq.float8(t)
    nonzero = t.abs() > 0.05
    assert ((f - t).abs() / t.abs())[nonzero].max() <= 2 ** -4 + 1e-6  # e4m3: 3 mantissa bits
    assert f.abs().max() == pytest.approx(5, rel=1e-6)


def test_compare_reports_identical_images_as_infinite_psnr():
    a = np.zeros((4, 4, 3), np.uint8)
    b = a.copy()
    b[0, 0, 0] = 10
    result = cq.compare([a, a], [a, b])
    assert result["psnr_db"][0] == float("inf")
    assert result["max_abs_diff"] == 10
    assert result["min_psnr_db"] == result["mean_psnr_db"] > 30


def test_layer_errors_measure_each_convolution_on_its_own_input_and_leave_no_hooks():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1),
                              torch.nn.Conv2d(16, 32, 1))
    x = torch.randn(2, 16, 6, 6)
    with torch.no_grad():
        errors = cq.LayerErrors(net, "per_batch")
        net(x)
        inner = net[0](x)
        ref = net[1](inner)
        q = torch.nn.functional.conv2d(cq.int8_rows(inner, (0, 1, 2, 3)),
                                       cq.int8_rows(net[1].weight, (1, 2, 3)), net[1].bias)
    assert errors.errors["1"] == pytest.approx(((q - ref).norm() / ref.norm()).item(), rel=1e-4)
    summary = errors.summary()
    assert summary["layers"] == 2 and not net[0]._forward_hooks and not net[1]._forward_hooks
    assert 0 < summary["median"] <= summary["max"] < 0.05


def test_the_none_variant_changes_nothing():
    net = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1))
    weight = net[0].weight.clone()
    with cq.Quantized(net, "none"):
        assert torch.equal(net[0].weight, weight) and not net[0]._forward_pre_hooks


def test_the_script_runs_end_to_end_on_the_cpu_at_toy_widths(tmp_path):
    pytest.importorskip("diffusers")
    from qpool_export import bpe, corpus

    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    bpe.write_tokenizer(str(tokenizer), bpe.train_bpe(corpus.PROMPTS, 1000))
    out = tmp_path / "result.json"
    script = pathlib.Path(cq.__file__)
    subprocess.run([sys.executable, str(script), "--model", "sd15", "--tiny", "--device", "cpu",
                    "--size", "64", "--steps", "2", "--images", "1", "--tokenizer",
                    str(tokenizer), "--work", str(tmp_path / "work"), "--variants",
                    "none,weights,per_batch", "--sweep", "per_batch", "--out", str(out)],
                   check=True, timeout=600,
                   capture_output=True)
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["tiny"]
    assert 0 < result["quantized_convolutions"] < result["unet_convolutions"]
    assert result["variants"]["none"]["max_abs_diff"] == 0  # the floor: the same images
    assert result["variants"]["weights"]["psnr_db"][0] < float("inf")
    for variant in cq.INPUT_DIMS:
        errors = result["layer_relative_error"][variant]
        assert errors["layers"] == result["quantized_convolutions"]
        assert 0 < errors["median"] <= errors["max"] < 0.1
    sweep = result["sweep"]
    assert sweep["of"] == result["quantized_convolutions"] == len(sweep["alone_psnr_db"])
    assert sweep["kept"] == sum(p >= sweep["threshold_db"] for p in sweep["alone_psnr_db"].values())
