"""Tests of the exporter's UNet building blocks (tools/qpool_export/qpool_export/blocks.py): the
group-norm variants, the resnet block's fused norms and convolution biases, and the fused attention
projections, each against the plain PyTorch operations it replaces. CPU only.

Run: .venv/bin/python -m pytest -q tests/python/test_unet_blocks.py
"""

import os
import sys

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "qpool_export"))

torch.set_num_threads(1)  # tiny ops: one thread is fastest and immune to a loaded CI machine

GROUP_NORM_SHAPES = [((1, 64, 9, 7), 32), ((2, 32, 4, 4), 32), ((3, 12, 5, 6), 4)]


def group_norm_pair(cls, channels, groups, seed):
    """An nn.GroupNorm with random affine parameters, `cls` holding the same state, and the
    generator for inputs."""
    gen = torch.Generator().manual_seed(seed)
    native = torch.nn.GroupNorm(groups, channels, eps=1e-6)
    with torch.no_grad():
        native.weight.copy_(torch.randn(channels, generator=gen))
        native.bias.copy_(torch.randn(channels, generator=gen))
    mine = cls(groups, channels, eps=1e-6)
    mine.load_state_dict(native.state_dict())
    return native, mine, gen


@pytest.mark.parametrize("shape,groups", GROUP_NORM_SHAPES)
def test_channels_last_group_norm_equals_group_norm_and_keeps_the_layout(shape, groups):
    from qpool_export.blocks import ChannelsLastGroupNorm

    native, mine, gen = group_norm_pair(ChannelsLastGroupNorm, shape[1], groups, seed=5)
    x = torch.randn(shape, generator=gen) * 3 + 2
    with torch.no_grad():
        want = native(x)
        traced = torch.jit.trace(mine, (x,))
        for layout in (torch.contiguous_format, torch.channels_last):
            y = traced(x.contiguous(memory_format=layout))
            torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
            assert y.is_contiguous(memory_format=layout)
        other = torch.randn(shape[0] + 1, shape[1], 3, 11, generator=gen)
        torch.testing.assert_close(traced(other), native(other), rtol=1e-5, atol=1e-5)
        # Saved in float16 (as the exporter does): within the documented bound, a few 1e-3 of
        # the output's scale times a group's |mean| / std; and no overflow where the variance
        # exceeds float16's range.
        big = (x - 2) * 300 + 500
        for sample in (x, big):
            std, mean = torch.std_mean(sample.unflatten(1, (groups, -1)), dim=(2, 3, 4))
            ratio = max((mean / std).abs().max().item(), 1)
            got = traced.half()(sample.half())
            assert got.dtype == torch.float16 and torch.isfinite(got).all()
            ref = native(sample.half().float())
            assert (got.float() - ref).abs().max() <= 3e-3 * ref.abs().max() * ratio
    with pytest.raises(ValueError):
        ChannelsLastGroupNorm(groups, shape[1], affine=False)


def test_a_resnet_block_norms_through_one_group_norm_op_each():
    """Note [Group norm op]: with ChannelsLastGroupNorm, a resnet block's norm1 + SiLU and its
    time-embedding addition + norm2 + SiLU each trace to one qpool::group_norm, with the result of
    the block built on nn.GroupNorm's separate operations."""
    from qpool_export.blocks import ChannelsLastGroupNorm, ResnetBlock2D

    torch.manual_seed(8)
    mine = ResnetBlock2D(64, 96, 32, 32, 1e-5, ChannelsLastGroupNorm).eval()
    native = ResnetBlock2D(64, 96, 32, 32, 1e-5, torch.nn.GroupNorm).eval()
    with torch.no_grad():
        for p in mine.parameters():
            p.normal_(0, 0.3)
        native.load_state_dict(mine.state_dict())
        x, temb = torch.randn(2, 64, 6, 5) * 2 + 1, torch.randn(2, 32)
        traced = torch.jit.trace(mine, (x, temb))
        nodes = [n.kind() for n in traced.inlined_graph.nodes()]
        assert nodes.count("qpool::group_norm") == 2
        assert "aten::silu" in nodes  # the time embedding's, before its projection
        assert nodes.count("aten::silu") == 1
        torch.testing.assert_close(traced(x, temb), native(x, temb), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("channels_last,gemm_shortcut", [(True, None), (False, None),
                                                          (True, False)])
@pytest.mark.parametrize("temb_dim", [32, None])
def test_a_resnet_block_adds_each_convolution_bias_in_a_pass_it_makes_anyway(
        channels_last, gemm_shortcut, temb_dim):
    """Note [Convolution biases]: conv2's bias and the residual trace to one qpool::bias_residual;
    with channels_last, conv1 runs without its bias, which joins norm2's addition (with the time
    embedding in a UNet's block, alone in a VAE decoder's), and the 1x1 shortcut is a linear
    unless gemm_shortcut is False (a float32 decoder's). The block equals the plain convolutions'
    and reads no tensor of another module (Note [Streaming]: each bias is read in its own module's
    forward)."""
    import torch.nn.functional as F
    from qpool_export.blocks import ChannelsLastGroupNorm, ResnetBlock2D

    torch.manual_seed(9)
    block = ResnetBlock2D(64, 96, temb_dim, 32, 1e-5, ChannelsLastGroupNorm,
                          channels_last=channels_last, gemm_shortcut=gemm_shortcut).eval()
    gemm = channels_last if gemm_shortcut is None else gemm_shortcut

    def plain(x, *temb):
        def norm_silu(norm, h):
            return F.silu(F.group_norm(h, 32, norm.weight, norm.bias, 1e-5))
        h = F.conv2d(norm_silu(block.norm1, x), block.conv1.weight, block.conv1.bias, padding=1)
        if temb:
            h = h + block.time_emb_proj(F.silu(temb[0]))[:, :, None, None]
        h = F.conv2d(norm_silu(block.norm2, h), block.conv2.weight, block.conv2.bias, padding=1)
        sc = block.conv_shortcut
        return F.conv2d(x, sc.weight, sc.bias) + h

    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.3)
        x = torch.randn(2, 64, 6, 5) * 2 + 1
        temb = (torch.randn(2, 32),) if temb_dim else ()
        traced = torch.jit.trace(block, (x, *temb))
        nodes = [n.kind() for n in traced.inlined_graph.nodes()]
        assert nodes.count("qpool::bias_residual") == 1
        assert nodes.count("qpool::group_norm") == 2
        # The time embedding's projection, and the shortcut as a GEMM.
        assert nodes.count("aten::linear") == bool(temb_dim) + gemm
        convs = [n for n in traced.inlined_graph.nodes() if n.kind() == "aten::_convolution"]
        assert len(convs) == 2 + (not gemm)
        # The convolutions that add their own bias (input 2): conv1 unless channels_last hands
        # its bias to norm2, and the shortcut unless it is a linear.
        with_bias = [c for c in convs if c.inputsAt(2).type().kind() != "NoneType"]
        assert len(with_bias) == (not channels_last) + (not gemm)
        children = {name for name, _ in block.named_children()}
        for node in traced.graph.nodes():
            if node.kind() == "prim::GetAttr":
                assert node.s("name") in children, node
        want = plain(x, *temb)
        torch.testing.assert_close(traced(x, *temb), want, rtol=1e-5, atol=1e-5)
        x_cl = x.contiguous(memory_format=torch.channels_last)
        got = traced(x_cl, *temb)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert got.is_contiguous(memory_format=torch.channels_last)
        # Traced at two images, right at three (conv1's bias is expanded to the batch at run
        # time).
        x3 = torch.randn(3, 64, 4, 7)
        temb3 = (torch.randn(3, 32),) if temb_dim else ()
        torch.testing.assert_close(traced(x3, *temb3), plain(x3, *temb3), rtol=1e-5, atol=1e-5)


def test_the_vae_attention_keeps_its_input_layout():
    """The VAE mid block's attention takes the pixels of a channels-last x as tokens without a
    copy and returns x's layout, with the result of diffusers' operations (norm, the pixels as
    [b, h * w, c] tokens, single-head attention, the output projection, the residual)."""
    import torch.nn.functional as F
    from qpool_export.blocks import ChannelsLastGroupNorm, VaeAttention

    torch.manual_seed(11)
    attn = VaeAttention(64, 32, 1e-6, ChannelsLastGroupNorm).eval()

    def plain(x):
        b, c, h, w = x.shape
        t = F.group_norm(x, 32, attn.group_norm.weight, attn.group_norm.bias, 1e-6)
        t = t.reshape(b, c, h * w).transpose(1, 2)
        q, k, v = (m(t)[:, None] for m in (attn.to_q, attn.to_k, attn.to_v))
        y = attn.to_out[0](F.scaled_dot_product_attention(q, k, v)[:, 0])
        return x + y.transpose(1, 2).reshape(b, c, h, w)

    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.2)
        x = torch.randn(2, 64, 5, 6) * 2 + 1
        traced = torch.jit.trace(attn, (x,))
        for layout in (torch.contiguous_format, torch.channels_last):
            for sample in (x, torch.randn(1, 64, 7, 3)):
                y = traced(sample.contiguous(memory_format=layout))
                torch.testing.assert_close(y, plain(sample), rtol=1e-5, atol=1e-5)
                assert y.is_contiguous(memory_format=layout)


@pytest.mark.parametrize("cross", [False, True])
def test_fused_attention_projections_equal_the_separate_ones(cross):
    """Note [Fused projections]: a self-attention's q / k / v as one to_qkv, a cross-attention's
    k / v as one to_kv, the same result as the three linears; a quantized part leaves it as is."""
    from qpool_export import quant
    from qpool_export.blocks import Attention, fuse_projections

    torch.manual_seed(3)
    attn = Attention(32, 24 if cross else None, 4, 8, qkv_bias=False)
    x, context = torch.randn(2, 10, 32), torch.randn(2, 7, 24)
    args = (x, context) if cross else (x,)
    with torch.no_grad():
        want = attn(*args)
        assert fuse_projections(torch.nn.Sequential(attn)) == 1
        fused = attn.to_kv if cross else attn.to_qkv
        assert fused.out_features == (2 if cross else 3) * 32
        assert (attn(*args) - want).abs().max().item() < 1e-6
    assert not any(hasattr(attn, n) for n in (["to_k", "to_v"] if cross else ["to_q", "to_k"]))

    quantized = Attention(32, None, 4, 8, qkv_bias=False)
    quant.quantize_module(quantized, "int8", skip=["to_out"])
    assert not quantized.fuse() and hasattr(quantized, "to_q")


def test_a_transformer_block_adds_each_residual_in_the_norm_after_it():
    """Note [Residual layer norm]: a transformer block's norm1 traces to one qpool::layer_norm and
    norm2 and norm3, with the residual additions before them, to one qpool::add_layer_norm each;
    the block equals diffusers' order of plain operations, keeps nn.LayerNorm's state_dict keys,
    and reads no tensor of another module (Note [Streaming])."""
    import torch.nn.functional as F
    from qpool_export.blocks import BasicTransformerBlock

    torch.manual_seed(10)
    block = BasicTransformerBlock(64, 24, 4).eval()

    def plain(x, context):
        def norm(module, h):
            return F.layer_norm(h, (64,), module.weight, module.bias, module.eps)
        x = x + block.attn1(norm(block.norm1, x))
        x = x + block.attn2(norm(block.norm2, x), context)
        return x + block.ff(norm(block.norm3, x))

    assert {"norm1.weight", "norm2.bias", "norm3.weight"} <= set(block.state_dict())
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.3)
        x, context = torch.randn(2, 12, 64) * 2 + 1, torch.randn(2, 5, 24)
        traced = torch.jit.trace(block, (x, context))
        nodes = [n.kind() for n in traced.inlined_graph.nodes()]
        assert nodes.count("qpool::layer_norm") == 1
        assert nodes.count("qpool::add_layer_norm") == 2
        assert "aten::layer_norm" not in nodes
        assert nodes.count("aten::add") == 1  # the feed-forward's residual
        children = {name for name, _ in block.named_children()}
        for node in traced.graph.nodes():
            if node.kind() == "prim::GetAttr":
                assert node.s("name") in children, node
        torch.testing.assert_close(traced(x, context), plain(x, context), rtol=1e-5, atol=1e-5)
        other = torch.randn(3, 7, 64)  # traced at one shape, right at another
        torch.testing.assert_close(traced(other, context[:1].expand(3, -1, -1)),
                                   plain(other, context[:1].expand(3, -1, -1)),
                                   rtol=1e-5, atol=1e-5)
        got = traced.half()(x.half(), context.half())
        block.half()
        assert got.dtype == torch.float16
        torch.testing.assert_close(got, plain(x.half(), context.half()), rtol=0, atol=0)


def test_the_upsamplers_trace_to_one_op_in_the_inputs_layout():
    """Note [Upsample op]: a VAE decoder's Upsample2D doubles and a UNet's UpsampleToSkip resizes to
    its skip connection's size, each through one qpool::upsample_nearest; traced at one size, right
    at another, with F.interpolate's values and in the input's layout."""
    import torch.nn.functional as F
    from qpool_export.blocks import Upsample2D
    from qpool_export.unet import UpsampleToSkip

    torch.manual_seed(12)
    double, to_skip = Upsample2D(8).eval(), UpsampleToSkip(8).eval()
    with torch.no_grad():
        x = torch.randn(2, 8, 3, 4)
        traced_double = torch.jit.trace(double, (x,))
        traced_skip = torch.jit.trace(to_skip, (x, torch.empty(2, 16, 6, 8)))
        for traced in (traced_double, traced_skip):
            nodes = [n.kind() for n in traced.inlined_graph.nodes()]
            assert nodes.count("qpool::upsample_nearest") == 1
            assert "aten::upsample_nearest2d" not in nodes
        for layout in (torch.contiguous_format, torch.channels_last):
            sample = torch.randn(1, 8, 5, 3).contiguous(memory_format=layout)
            y = traced_double(sample)
            want = double.conv(F.interpolate(sample, scale_factor=2.0, mode="nearest"))
            torch.testing.assert_close(y, want, rtol=0, atol=0)
            assert y.shape == (1, 8, 10, 6) and y.is_contiguous(memory_format=layout)
            # A skip connection one less than twice the size (an odd size on the way down).
            y = traced_skip(sample, torch.empty(1, 16, 9, 5))
            want = to_skip.conv(F.interpolate(sample, size=(9, 5), mode="nearest"))
            torch.testing.assert_close(y, want, rtol=0, atol=0)
            assert y.shape == (1, 8, 9, 5)
