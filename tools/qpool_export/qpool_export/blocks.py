"""Building blocks shared by the UNet and the VAE decoder (diffusers-shaped, written for qpool).

Trace-safety rules every block follows: shapes are read from tensors at run time (never stored as
Python ints), dtypes follow the input (`type_as`), and linear layers are plain nn.Linear.
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import ops
from .smoothquant import Fold


# Note [Fused projections]
# fuse() replaces the linears of an attention that read the same input by one linear with their
# weights (and biases) concatenated along the outputs: q / k / v of a self-attention, k / v of a
# cross-attention (both read the text), and in FLUX more (flux_transformer.py). Each output is
# the same dot product as before, so the results are the separate linears' up to the GEMM's
# summation order, while the step runs one GEMM of 3N (or 2N) columns where it ran three (or two)
# of N: fewer launches, fewer partial waves of tiles, and for w8a8 one quantization of the input
# instead of three. Quantizing the fused weight per output row (int8, w8a8) or per block of a row
# (nf4, rows a multiple of the block) equals quantizing the parts. The exporters fuse before
# quantizing and tracing, except for a bitsandbytes checkpoint, whose layers arrive quantized
# under their own names (and double quantization's per-tensor offset does not concatenate).


def fused_linear(parts: Sequence[nn.Module]) -> Optional[nn.Linear]:
    """One nn.Linear computing `parts` (nn.Linears of one input width, all with or all without
    a bias) side by side, on their tensors' device and dtype (Note [Fused projections]); None
    when they are not such linears (a quantized layer, say)."""
    if any(type(p) is not nn.Linear for p in parts):
        return None
    first = parts[0]
    if any(p.in_features != first.in_features or (p.bias is None) != (first.bias is None)
           for p in parts):
        return None
    fused = nn.Linear(first.in_features, sum(p.out_features for p in parts),
                      bias=first.bias is not None, device="meta")
    with torch.no_grad():
        fused.weight = nn.Parameter(torch.cat([p.weight for p in parts]), requires_grad=False)
        if first.bias is not None:
            fused.bias = nn.Parameter(torch.cat([p.bias for p in parts]), requires_grad=False)
    return fused


# qpool::group_norm's schema, byte-identical to kGroupNormSchema in server/quant/group_norm_op.h (a
# unit test compares them).
GROUP_NORM_SCHEMA = \
    "group_norm(Tensor x, Tensor weight, Tensor bias, int groups, float eps, Tensor? add, bool silu) -> Tensor"  # noqa: E501


def _group_norm_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, groups: int,
                    eps: float, add: Optional[torch.Tensor], silu: bool) -> torch.Tensor:
    """qpool::group_norm's reference (Note [Group norm op] in server/quant/group_norm_op.h): the
    addition, ChannelsLastGroupNorm's unfused operations, the SiLU."""
    if add is not None:
        x = x + add[:, :, None, None]
    std, mean = torch.std_mean(x.unflatten(1, (groups, -1)), dim=(2, 3, 4), correction=0)
    # 1 / sqrt(var + eps) as 1 / hypot(std, sqrt(eps)): std is never squared in fp16.
    rstd = torch.reciprocal(torch.hypot(std, torch.full_like(std, math.sqrt(eps))))
    scale = rstd[:, :, None] * weight.reshape(groups, -1)  # [n, groups, channels per group]
    shift = torch.addcmul(bias.reshape(groups, -1), mean[:, :, None], scale, value=-1)
    y = torch.addcmul(shift.flatten(1)[:, :, None, None], x, scale.flatten(1)[:, :, None, None])
    return F.silu(y) if silu else y


def _group_norm_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, groups: int,
                     eps: float, add: Optional[torch.Tensor], silu: bool) -> torch.Tensor:
    return torch.empty_like(x)


_GROUP_NORM_LIB = ops.register(GROUP_NORM_SCHEMA, _group_norm_ref, _group_norm_fake)


class ChannelsLastGroupNorm(nn.GroupNorm):
    """nn.GroupNorm (same parameters, state_dict keys and, in float32, result) that keeps its
    input's memory layout: channels-last in, channels-last out; one qpool::group_norm op, which
    can also add a per-channel vector before the norm and apply the SiLU after it.

    PyTorch's CUDA group norm makes its input contiguous (NCHW) first, so in a UNet or VAE decoder
    whose convolutions run channels-last (the server lays their weights out so on GPUs) each norm
    cost a copy to NCHW and the next convolution a copy back. The op's reference takes a group as
    a view of the input in either layout, its statistics from one general reduction (std_mean
    accumulates in float32, and a standard deviation cannot overflow fp16 where a variance above
    65504 would), and normalizes with the affine in one addcmul of per-channel scale and shift,
    which keeps the input's strides; the server's CUDA kernel does all of it in two passes (Note
    [Group norm op]).
    In fp16 the reference's scale and shift are fp16 numbers: its output differs from the native
    norm's by a few 1e-3 of its scale times a group's |mean| / std (tested)."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5,
                 affine: bool = True):
        if not affine:
            raise ValueError("ChannelsLastGroupNorm needs the affine weight and bias")
        super().__init__(num_groups, num_channels, eps=eps, affine=True)

    def forward(self, x: torch.Tensor, add: Optional[torch.Tensor] = None,
                silu: bool = False) -> torch.Tensor:
        """The norm of x + add[:, :, None, None] (add [N, C]), then its SiLU when `silu`."""
        return torch.ops.qpool.group_norm(x, self.weight, self.bias, self.num_groups, self.eps,
                                          add, silu)


def norm_silu(norm: nn.Module, x: torch.Tensor,
              add: Optional[torch.Tensor] = None) -> torch.Tensor:
    """silu(norm(x + add[:, :, None, None])): one qpool::group_norm op for a
    ChannelsLastGroupNorm, the separate operations for any other norm."""
    if isinstance(norm, ChannelsLastGroupNorm):
        return norm(x, add, silu=True)
    if add is not None:
        x = x + add[:, :, None, None]
    return F.silu(norm(x))


# qpool::bias_residual's schema, byte-identical to kBiasResidualSchema in
# server/quant/bias_residual_op.h (a unit test compares them).
BIAS_RESIDUAL_SCHEMA = "bias_residual(Tensor x, Tensor bias, Tensor residual) -> Tensor"


def _bias_residual_ref(x: torch.Tensor, bias: torch.Tensor,
                       residual: torch.Tensor) -> torch.Tensor:
    """residual + (x + bias per channel): qpool::bias_residual's reference, the two additions a
    convolution's bias and a residual cost unfused (Note [Convolution biases] in
    server/quant/bias_residual_op.h)."""
    # Into x's layout, as the fake says (ATen's addition would follow the residual's).
    return torch.add(residual, x + bias.view([1, -1] + [1] * (x.dim() - 2)),
                     out=torch.empty_like(x))


def _bias_residual_fake(x: torch.Tensor, bias: torch.Tensor,
                        residual: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


_BIAS_RESIDUAL_LIB = ops.register(BIAS_RESIDUAL_SCHEMA, _bias_residual_ref, _bias_residual_fake)


# The convolutions below are nn.Conv2d (same parameters, state_dict keys and results up to the
# order of additions) that leave their bias to an operation after them, which adds it in a pass it
# makes anyway (Note [Convolution biases] in server/quant/bias_residual_op.h). Each reads its bias
# in its own forward, as streaming requires.
class TimeBiasConv2d(nn.Conv2d):
    """A resnet block's conv1: forward(x, add) is (the convolution without its bias, add + bias),
    the second for qpool::group_norm's addition before the next norm: the time embedding [N, C]
    plus the bias, or the bias alone for each of the N images when `add` is None."""

    def forward(self, x: torch.Tensor,
                add: Optional[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        y = self._conv_forward(x, self.weight, None)
        if add is None:
            return y, self.bias.expand(x.shape[0], -1)
        return y, add + self.bias


class ResidualConv2d(nn.Conv2d):
    """A resnet block's conv2: forward(x, residual) is residual + the convolution, its bias added
    in the same qpool::bias_residual pass as the residual."""

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return torch.ops.qpool.bias_residual(self._conv_forward(x, self.weight, None), self.bias,
                                             residual)


class PointwiseConv2d(nn.Conv2d):
    """A 1x1 convolution run as a linear over the pixels, whose GEMM adds the bias in its
    epilogue: channels-last x in, channels-last out, no copy (x in another layout is copied for
    the GEMM)."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__(in_channels, out_channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x.permute(0, 2, 3, 1), self.weight.flatten(1), self.bias)
        return y.permute(0, 3, 1, 2)


class ResnetBlock2D(nn.Module):
    """GroupNorm-SiLU-conv twice, with an optional time-embedding injection and 1x1 shortcut.
    conv2 adds its bias with the residual (ResidualConv2d). With `channels_last` (a UNet's or a
    VAE decoder's, whose convolutions run so on GPUs), conv1 hands its bias to norm2's addition,
    with the time embedding where there is one (TimeBiasConv2d), and the shortcut is a GEMM
    (PointwiseConv2d) unless `gemm_shortcut` is False (a float32 decoder's: cuDNN convolutions run
    in TF32, float32 GEMMs without tensor cores)."""

    def __init__(self, in_channels: int, out_channels: int, temb_channels: Optional[int],
                 groups: int, eps: float, norm: Callable[..., nn.GroupNorm] = nn.GroupNorm,
                 channels_last: bool = False, gemm_shortcut: Optional[bool] = None):
        super().__init__()
        self.norm1 = norm(groups, in_channels, eps=eps)
        self.conv1_hands_bias = channels_last
        conv1 = TimeBiasConv2d if channels_last else nn.Conv2d
        self.conv1 = conv1(in_channels, out_channels, 3, padding=1)
        self.time_emb_proj = nn.Linear(temb_channels, out_channels) if temb_channels else None
        self.norm2 = norm(groups, out_channels, eps=eps)
        self.conv2 = ResidualConv2d(out_channels, out_channels, 3, padding=1)
        gemm = channels_last if gemm_shortcut is None else gemm_shortcut
        shortcut = (PointwiseConv2d(in_channels, out_channels) if gemm
                    else nn.Conv2d(in_channels, out_channels, 1))
        self.conv_shortcut = shortcut if in_channels != out_channels else None

    def forward(self, x: torch.Tensor, temb: Optional[torch.Tensor] = None) -> torch.Tensor:
        h = norm_silu(self.norm1, x)
        emb = None
        if self.time_emb_proj is not None:
            if temb is None:
                raise ValueError("a resnet block with a time-embedding projection takes temb")
            emb = self.time_emb_proj(F.silu(temb))
        if self.conv1_hands_bias:
            h, emb = self.conv1(h, emb)
        else:
            h = self.conv1(h)
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        return self.conv2(norm_silu(self.norm2, h, emb), x)


class Downsample2D(nn.Module):
    """3x3 convolution with stride 2."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


# qpool::upsample_nearest's schema, byte-identical to kUpsampleSchema in
# server/quant/upsample_op.h (a unit test compares them).
UPSAMPLE_SCHEMA = "upsample_nearest(Tensor x, Tensor? like) -> Tensor"


def _upsample_ref(x: torch.Tensor, like: Optional[torch.Tensor]) -> torch.Tensor:
    """qpool::upsample_nearest's reference (Note [Upsample op] in server/quant/upsample_op.h):
    ATen's nearest upsampling to like's height and width, or twice x's, in x's layout; on fake
    tensors, the output's sizes and layout."""
    # A size read from `like` or a scale factor, not one computed here, keeps a traced graph
    # shape-generic.
    if like is None:
        return F.interpolate(x, scale_factor=2.0, mode="nearest")
    return F.interpolate(x, size=(like.shape[2], like.shape[3]), mode="nearest")


_UPSAMPLE_LIB = ops.register(UPSAMPLE_SCHEMA, _upsample_ref, _upsample_ref)


class Upsample2D(nn.Module):
    """Nearest-neighbour 2x upsampling (one qpool::upsample_nearest op, which the server runs in
    one vectorized pass over a channels-last map) followed by a 3x3 convolution."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(torch.ops.qpool.upsample_nearest(x, None))


class Attention(nn.Module):
    """Multi-head attention of [B, N, query_dim] over a context [B, M, context_dim] (self-attention
    when no context is given)."""

    def __init__(self, query_dim: int, context_dim: Optional[int], heads: int, head_dim: int,
                 qkv_bias: bool):
        super().__init__()
        inner = heads * head_dim
        self.self_attention = context_dim is None
        context_dim = context_dim or query_dim
        self.heads = heads
        self.to_q = nn.Linear(query_dim, inner, bias=qkv_bias)
        self.to_k = nn.Linear(context_dim, inner, bias=qkv_bias)
        self.to_v = nn.Linear(context_dim, inner, bias=qkv_bias)
        self.to_out = nn.ModuleList([nn.Linear(inner, query_dim)])

    def fuse(self) -> bool:
        """Self-attention: to_q / to_k / to_v as one to_qkv; cross-attention: to_k / to_v as one
        to_kv (Note [Fused projections]). False, changing nothing, where they are not plain
        linears."""
        if self.self_attention:
            fused = fused_linear([self.to_q, self.to_k, self.to_v])
            if fused is None:
                return False
            del self.to_q, self.to_k, self.to_v
            self.to_qkv = fused
            return True
        fused = fused_linear([self.to_k, self.to_v])
        if fused is None:
            return False
        del self.to_k, self.to_v
        self.to_kv = fused
        return True

    def _split(self, t: torch.Tensor) -> torch.Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.heads, -1).transpose(1, 2)

    def forward(self, x: torch.Tensor, context: Optional[torch.Tensor] = None) -> torch.Tensor:
        ctx = x if context is None else context
        if hasattr(self, "to_qkv"):
            q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        elif hasattr(self, "to_kv"):
            q, (k, v) = self.to_q(x), self.to_kv(ctx).chunk(2, dim=-1)
        else:
            q, k, v = self.to_q(x), self.to_k(ctx), self.to_v(ctx)
        q, k, v = self._split(q), self._split(k), self._split(v)
        y = F.scaled_dot_product_attention(q, k, v)
        b, _, n, _ = y.shape
        return self.to_out[0](y.transpose(1, 2).reshape(b, n, -1))

    def smoothing_folds(self) -> List[Fold]:
        """The output projection reads the value projection's channels, alone or the last rows of
        a fused one (Note [Folded smoothing] in smoothquant.py)."""
        inner = self.to_out[0].in_features
        if hasattr(self, "to_qkv"):
            return [Fold("to_out.0", "to_qkv", (2 * inner, 3 * inner))]
        if hasattr(self, "to_kv"):
            return [Fold("to_out.0", "to_kv", (inner, 2 * inner))]
        return [Fold("to_out.0", "to_v")]


# qpool::geglu's schema, byte-identical to kGegluSchema in server/quant/geglu_op.h (a unit test
# compares them).
GEGLU_SCHEMA = "geglu(Tensor x) -> Tensor"


def geglu_ref(x: torch.Tensor) -> torch.Tensor:
    """The value half of x times the exact GELU of its gate half: qpool::geglu's reference, the
    unfused operations of diffusers' GEGLU (Note [GEGLU op] in server/quant/geglu_op.h)."""
    value, gate = x.chunk(2, dim=-1)
    return value * F.gelu(gate)


def _geglu_fake(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], x.shape[-1] // 2))


_GEGLU_LIB = ops.register(GEGLU_SCHEMA, geglu_ref, _geglu_fake)


class GEGLU(nn.Module):
    """Linear to 2*inner, then value * gelu(gate), the second step one qpool::geglu op, or none
    once quant.fuse_geglu_linears() has moved it into the output linear (in_linear). The
    projection is an nn.Identity once quant.fuse_norm_linears() has moved it into the block's
    norm3."""

    def __init__(self, dim: int, inner: int):
        super().__init__()
        self.proj = nn.Linear(dim, inner * 2)
        self.in_linear = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        return h if self.in_linear else torch.ops.qpool.geglu(h)


class FeedForward(nn.Module):
    """GEGLU, (dropout), linear: diffusers' FeedForward, whose output linear is net.2."""

    def __init__(self, dim: int, mult: int = 4):
        super().__init__()
        self.net = nn.ModuleList([GEGLU(dim, dim * mult), nn.Identity(), nn.Linear(dim * mult, dim)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net[2](self.net[0](x))

    def smoothing_folds(self) -> List[Fold]:
        """The output layer reads the GEGLU's value half, the projection's first rows, times the
        GELU of the gate half (Note [Folded smoothing] in smoothquant.py)."""
        return [Fold("net.2", "net.0.proj", (0, self.net[2].in_features))]


# qpool::layer_norm's and qpool::add_layer_norm's schemas, byte-identical to kLayerNormSchema and
# kAddLayerNormSchema in server/quant/layer_norm_op.h (a unit test compares them).
LAYER_NORM_SCHEMA = "layer_norm(Tensor x, Tensor weight, Tensor bias, float eps) -> Tensor"
ADD_LAYER_NORM_SCHEMA = \
    "add_layer_norm(Tensor x, Tensor residual, Tensor weight, Tensor bias, float eps) -> (Tensor, Tensor)"  # noqa: E501


def layer_norm_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                   eps: float) -> torch.Tensor:
    """aten::layer_norm over the last dimension: qpool::layer_norm's reference."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps).contiguous()


def _layer_norm_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                     eps: float) -> torch.Tensor:
    return x.new_empty(x.shape)


def add_layer_norm_ref(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       bias: torch.Tensor, eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """(x + residual, its layer_norm): qpool::add_layer_norm's reference, the unfused operations
    (Note [Residual layer norm] in server/quant/layer_norm_op.h)."""
    total = (x + residual).contiguous()
    return total, F.layer_norm(total, (x.shape[-1],), weight, bias, eps).contiguous()


def _add_layer_norm_fake(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor, eps: float) -> Tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty(x.shape), x.new_empty(x.shape)


_LAYER_NORM_LIB = ops.register(LAYER_NORM_SCHEMA, layer_norm_ref, _layer_norm_fake)
_ADD_LAYER_NORM_LIB = ops.register(ADD_LAYER_NORM_SCHEMA, add_layer_norm_ref,
                                   _add_layer_norm_fake)


class FusedLayerNorm(nn.LayerNorm):
    """nn.LayerNorm (affine, over the last dimension) as one qpool::layer_norm op."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.qpool.layer_norm(x, self.weight, self.bias, self.eps)


class ResidualLayerNorm(nn.LayerNorm):
    """The residual addition before a LayerNorm and the norm in one qpool::add_layer_norm op:
    forward(x, residual) returns (x + residual, the norm of it). The same parameters and
    state_dict keys as nn.LayerNorm."""

    def forward(self, x: torch.Tensor,  # type: ignore[override]
                residual: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return torch.ops.qpool.add_layer_norm(x, residual, self.weight, self.bias, self.eps)


class BasicTransformerBlock(nn.Module):
    """Self-attention, cross-attention to the text, GEGLU feed-forward; pre-LN, residual. norm2
    and norm3 add the residual before them (ResidualLayerNorm, Note [Residual layer norm]). Where
    quant.fuse_norm_linears() has moved the linear that reads a norm into the norm's module (Note
    [Norm linear op]), the norm returns that linear's output and the linear's place holds an
    nn.Identity: the forward is the same."""

    def __init__(self, dim: int, cross_dim: int, heads: int):
        super().__init__()
        head_dim = dim // heads
        self.norm1 = FusedLayerNorm(dim)
        self.attn1 = Attention(dim, None, heads, head_dim, qkv_bias=False)
        self.norm2 = ResidualLayerNorm(dim)
        self.attn2 = Attention(dim, cross_dim, heads, head_dim, qkv_bias=False)
        self.norm3 = ResidualLayerNorm(dim)
        self.ff = FeedForward(dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        x, h = self.norm2(self.attn1(self.norm1(x)), x)
        x, h = self.norm3(self.attn2(h, context), x)
        return x + self.ff(h)

    def smoothing_folds(self) -> List[Fold]:
        """Each norm feeds one layer: the fused self-attention projection (separate q / k / v
        would need one scale for three layers), the cross-attention's query, the feed-forward
        (Note [Folded smoothing] in smoothquant.py)."""
        folds = [Fold("attn2.to_q", "norm2"), Fold("ff.net.0.proj", "norm3")]
        if hasattr(self.attn1, "to_qkv"):
            folds.append(Fold("attn1.to_qkv", "norm1"))
        return folds


class Transformer2D(nn.Module):
    """GroupNorm, 1x1 conv in, transformer blocks over the H*W tokens, 1x1 conv out, residual
    (the 1x1 convolutions as linears over the pixels, PointwiseConv2d)."""

    def __init__(self, channels: int, cross_dim: int, heads: int, groups: int, depth: int = 1):
        super().__init__()
        if channels % heads:
            raise ValueError(f"{channels} channels are not divisible by {heads} heads")
        self.norm = ChannelsLastGroupNorm(groups, channels, eps=1e-6)
        self.proj_in = PointwiseConv2d(channels, channels)
        self.transformer_blocks = nn.ModuleList(
            BasicTransformerBlock(channels, cross_dim, heads) for _ in range(depth))
        self.proj_out = PointwiseConv2d(channels, channels)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        t = self.proj_in(self.norm(x)).permute(0, 2, 3, 1).reshape(b, h * w, c)
        for block in self.transformer_blocks:
            t = block(t, context)
        return x + self.proj_out(t.reshape(b, h, w, c).permute(0, 3, 1, 2))


class VaeAttention(nn.Module):
    """Single-head spatial self-attention with group norm and residual (VAE mid block)."""

    def __init__(self, channels: int, groups: int, eps: float = 1e-6,
                 norm: Callable[..., nn.GroupNorm] = nn.GroupNorm):
        super().__init__()
        self.group_norm = norm(groups, channels, eps=eps)
        self.to_q = nn.Linear(channels, channels)
        self.to_k = nn.Linear(channels, channels)
        self.to_v = nn.Linear(channels, channels)
        self.to_out = nn.ModuleList([nn.Linear(channels, channels)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        # The pixels as tokens [b, h * w, c]: a view of a channels-last x (a copy of an NCHW one),
        # and back as a view in channels-last order.
        t = self.group_norm(x).permute(0, 2, 3, 1).reshape(b, h * w, c)
        q, k, v = self.to_q(t)[:, None], self.to_k(t)[:, None], self.to_v(t)[:, None]
        y = F.scaled_dot_product_attention(q, k, v)[:, 0]
        y = self.to_out[0](y)
        return x + y.view(b, h, w, c).permute(0, 3, 1, 2)


def fuse_projections(module: nn.Module) -> int:
    """Fuses the projections of every Attention in `module` (Note [Fused projections]); returns
    how many were fused."""
    return sum(m.fuse() for m in list(module.modules()) if isinstance(m, Attention))
